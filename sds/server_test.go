package sds

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/uds/streamlimit"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/sdsclient"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitMetric waits until a counter or gauge reads want.
func waitMetric(t testing.TB, m prometheus.Collector, want float64) {
	t.Helper()
	testwait.For(t, fmt.Sprintf("the metric to read %v", want), func() bool { return testutil.ToFloat64(m) == want })
}

var testID = pki.SPIFFEIdentity("cluster.local", "ns1", "sa1")

// shortDir is a temporary directory with a path short enough for a Unix
// socket address, removed when the test ends.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sds")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

type fixture struct {
	t      testing.TB
	dir    string
	socket string
	clock  *clocktesting.FakeClock
	ca     *localca.CA
	dev    *devca.Client
	mgr    *secretmanager.Manager
	srv    *Server
	uds    *udsserver.Server
	reg    *prometheus.Registry
	logs   *observer.ObservedLogs
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type fixtureOpts struct {
	ttl        time.Duration
	holdManger bool          // start the manager only when startManager is called
	config     func(*Config) // adjusts the server's Config
	providers  map[string]secretmanager.Provider
	socket     func(*udsserver.Config)
}

func newFixture(t testing.TB, o fixtureOpts) *fixture {
	t.Helper()
	if o.ttl == 0 {
		o.ttl = time.Hour
	}
	f := &fixture{t: t, dir: shortDir(t), reg: prometheus.NewRegistry()}
	f.socket = filepath.Join(f.dir, "run", "sds", "socket")
	f.clock = clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	var err error
	f.ca, err = localca.New(localca.Config{Intermediate: true, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	f.dev, err = devca.New(devca.Config{CA: f.ca})
	if err != nil {
		t.Fatal(err)
	}
	roots, err := secret.NewRoots(f.ca.RootPEM(), "dev-ca")
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	f.logs = logs
	f.mgr, err = secretmanager.New(secretmanager.Config{
		Identity: testID, CA: f.dev, Roots: roots, TTL: o.ttl,
		Clock: f.clock, Rand: func() float64 { return 0.5 }, Logger: zap.New(core),
		Providers:  o.providers,
		GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Secrets: f.mgr, Logger: zap.New(core), Registerer: f.reg, MaxStreams: 4096, MaxStreamsPerCaller: 64, MaxFileNamesPerCaller: 16,
		LimitNames: streamlimit.Names{Max: "MESHAGENT_SDS_MAX_STREAMS", PerCaller: "MESHAGENT_SDS_MAX_STREAMS_PER_POD"}}
	if o.config != nil {
		o.config(&cfg)
	}
	f.srv, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ucfg := udsserver.Config{SocketPath: f.socket, Logger: zap.New(core), MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute}
	if o.socket != nil {
		o.socket(&ucfg)
	}
	f.uds, err = socketServer(f.srv, ucfg)
	if err != nil {
		t.Fatal(err)
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.run("socket", f.uds.Run)
	t.Cleanup(f.stop)
	if !o.holdManger {
		f.startManager()
		// Every name on a stream resolves on its own: a stream opened
		// before the certificate exists is answered without it, then
		// updated. Tests start from a held certificate unless they hold
		// the manager.
		f.waitCert()
	}
	return f
}

// socketServer serves srv on the local socket server cfg describes.
func socketServer(srv *Server, cfg udsserver.Config) (*udsserver.Server, error) {
	cfg.Services = append(cfg.Services, srv.Register)
	return udsserver.New(cfg)
}

func (f *fixture) run(name string, fn func(context.Context) error) {
	f.wg.Go(func() {
		if err := fn(f.ctx); err != nil {
			f.t.Errorf("%s: Run returned %v", name, err)
		}
	})
}

func (f *fixture) startManager() { f.run("manager", f.mgr.Run) }

// waitCert waits until the manager holds the workload certificate. A stream
// opened before is answered when it arrives, as an update rather than as
// the answer to its request.
func (f *fixture) waitCert() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.mgr.Secret(ctx, pki.Identity{}, secretmanager.WorkloadCertName); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) stop() {
	f.cancel()
	f.wg.Wait()
}

func (f *fixture) dial() *sdsclient.Client {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, f.socket)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (f *fixture) stream(c *sdsclient.Client, cfg sdsclient.StreamConfig) *sdsclient.Stream {
	f.t.Helper()
	s, err := c.Stream(context.Background(), cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(s.Close)
	return s
}

func next(t testing.TB, s *sdsclient.Stream) *sdsclient.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("waiting for a response: %v", err)
	}
	return r
}

// step advances the fake clock once the manager waits on it.
func (f *fixture) step(d time.Duration) {
	f.t.Helper()
	testwait.Step(f.t, f.clock, d)
}

// checkCert checks a served TlsCertificate: the SPIFFE SAN, a chain that
// verifies to the CA root, a PKCS#8 key that matches.
func (f *fixture) checkCert(r *sdsclient.Response) []byte {
	f.t.Helper()
	chainPEM, keyPEM, ok := r.Cert(secretmanager.WorkloadCertName)
	if !ok {
		f.t.Fatalf("response %v holds no TlsCertificate named default", r.Names)
	}
	chain, err := pki.ParseCertificates(chainPEM)
	if err != nil {
		f.t.Fatal(err)
	}
	if !bytes.Contains(keyPEM, []byte("-----BEGIN PRIVATE KEY-----")) {
		f.t.Fatal("key is not PKCS#8 PEM")
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := pki.VerifyIssued(chain, key.Public(), testID, f.ca.Pool(), f.clock.Now()); err != nil {
		f.t.Fatalf("served certificate: %v", err)
	}
	if len(chain[0].URIs) != 1 || chain[0].URIs[0].String() != testID.SPIFFEID {
		f.t.Fatalf("SAN %v, want %s", chain[0].URIs, testID)
	}
	return chainPEM
}

func TestDefaultAndROOTCA(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	c := f.dial()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	both := f.stream(c, sdsclient.StreamConfig{Names: []string{"default", "ROOTCA"}})
	r := next(t, both)
	if len(r.Names) != 2 || r.Names[0] != "default" || r.Names[1] != "ROOTCA" {
		t.Fatalf("names %v", r.Names)
	}
	f.checkCert(r)
	ca, ok := r.TrustedCA("ROOTCA")
	if !ok || !bytes.Equal(ca, f.ca.RootPEM()) {
		t.Fatal("ROOTCA does not carry the CA root")
	}
	if !strings.Contains(r.Version, "/") || r.Nonce == "" {
		t.Errorf("version %q nonce %q", r.Version, r.Nonce)
	}

	// Separate streams per resource, as Envoy may open them.
	d := next(t, f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}}))
	if len(d.Names) != 1 {
		t.Fatalf("names %v", d.Names)
	}
	f.checkCert(d)
	root := next(t, f.stream(c, sdsclient.StreamConfig{Names: []string{"ROOTCA"}}))
	if _, ok := root.TrustedCA("ROOTCA"); !ok || len(root.Names) != 1 {
		t.Fatal("ROOTCA stream")
	}

	// No names: default and ROOTCA.
	all := next(t, f.stream(c, sdsclient.StreamConfig{}))
	if len(all.Names) != 2 || all.Names[0] != "default" || all.Names[1] != "ROOTCA" {
		t.Fatalf("empty request served %v", all.Names)
	}

	fr, err := c.Fetch(ctx, "default", "default", "ROOTCA")
	if err != nil {
		t.Fatal(err)
	}
	if len(fr.Names) != 2 {
		t.Fatalf("fetch names %v", fr.Names)
	}
	f.checkCert(fr)
	if got := testutil.ToFloat64(f.srv.metrics.streams); got != 4 {
		t.Errorf("streams gauge %v, want 4", got)
	}
	if f.dev.Requests() != 1 {
		t.Errorf("%d CSRs, want 1", f.dev.Requests())
	}
}

func TestRotationPushedOnSameStream(t *testing.T) {
	f := newFixture(t, fixtureOpts{ttl: 30 * time.Second})
	s := f.stream(f.dial(), sdsclient.StreamConfig{Names: []string{"default"}})
	first := next(t, s)
	oldChain := f.checkCert(first)
	old, _ := pki.ParseCertificates(oldChain)

	f.step(15 * time.Second)
	second := next(t, s)
	newChain := f.checkCert(second)
	if bytes.Equal(oldChain, newChain) || second.Version == first.Version || second.Nonce == first.Nonce {
		t.Fatal("the push repeats the old certificate")
	}
	if !f.clock.Now().Before(old[0].NotAfter) {
		t.Fatal("the new certificate came after the old one expired")
	}
	// The server counts a push after Send returns, which may be after the
	// client has it.
	waitMetric(t, f.srv.metrics.pushes.WithLabelValues(pushUpdate), 1)
}

// Requests on a stream are handled in order, so a request that must be
// answered, sent after one that must not, proves the first got no reply.
func TestACKNACKAndStaleNonce(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	s := f.stream(f.dial(), sdsclient.StreamConfig{Names: []string{"default"}, ManualACK: true})
	r1 := next(t, s)

	if err := s.ACK(r1); err != nil {
		t.Fatal(err)
	}
	if err := s.Request([]string{"default", "ROOTCA"}, r1.Nonce, r1.Version); err != nil {
		t.Fatal(err)
	}
	r2 := next(t, s)
	if len(r2.Names) != 2 {
		t.Fatalf("after ACK the next response is %v, want the answer to the name change", r2.Names)
	}

	if err := s.NACK(r2, r1.Version, "bad certificate"); err != nil {
		t.Fatal(err)
	}
	if err := s.Request([]string{"ROOTCA"}, r2.Nonce, r1.Version); err != nil {
		t.Fatal(err)
	}
	r3 := next(t, s)
	if len(r3.Names) != 1 || r3.Names[0] != "ROOTCA" {
		t.Fatalf("after NACK the next response is %v, want [ROOTCA]", r3.Names)
	}
	if got := testutil.ToFloat64(f.srv.metrics.nacks); got != 1 {
		t.Errorf("nacks = %v, want 1", got)
	}
	nackLogs := f.logs.FilterMessage("client rejected secrets").All()
	if len(nackLogs) != 1 || nackLogs[0].ContextMap()[logkeys.ErrorDetail] != "bad certificate" {
		t.Errorf("NACK logs %v", nackLogs)
	}

	// A stale nonce (r2's, not r3's) is ignored even though it changes names.
	if err := s.Request([]string{"default"}, r2.Nonce, r2.Version); err != nil {
		t.Fatal(err)
	}
	if err := s.Request([]string{"default", "ROOTCA"}, r3.Nonce, r3.Version); err != nil {
		t.Fatal(err)
	}
	r4 := next(t, s)
	if len(r4.Names) != 2 {
		t.Fatalf("after a stale request the next response is %v, want the answer to the fresh one", r4.Names)
	}
	if got := testutil.ToFloat64(f.srv.metrics.stale); got != 1 {
		t.Errorf("stale = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.srv.metrics.acks); got != 1 {
		t.Errorf("acks = %v, want 1", got)
	}
	select {
	case r := <-s.Responses():
		t.Fatalf("unexpected response %v", r.Names)
	default:
	}
}

func TestBadRequestsEndWithInvalidArgument(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	c := f.dial()
	tests := []struct {
		name    string
		req     func(*sdsclient.Stream) error
		mention string
	}{
		{"unknown name", func(s *sdsclient.Stream) error { return s.Request([]string{"default", "nope"}, "", "") }, `"nope"`},
		{"file-cert without provider", func(s *sdsclient.Stream) error { return s.Request([]string{"file-cert:/a~/b"}, "", "") }, "file-cert:/a~/b"},
		{"too many names", func(s *sdsclient.Stream) error {
			names := make([]string, DefaultMaxNames+1)
			for i := range names {
				names[i] = "default"
			}
			return s.Request(names, "", "")
		}, "at most"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := c.Stream(context.Background(), sdsclient.StreamConfig{Names: nil})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			next(t, s) // the answer to the empty first request
			if err := tt.req(s); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = s.Next(ctx)
			if !errors.Is(err, sdsclient.ErrEnded) {
				t.Fatalf("stream still open: %v", err)
			}
			st, _ := status.FromError(s.Err())
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tt.mention) {
				t.Fatalf("stream ended with %v, want InvalidArgument mentioning %s", s.Err(), tt.mention)
			}
		})
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Fetch(ctx, "nope")
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("Fetch of an unknown name: %v", err)
	}
	s, err := c.Stream(ctx, sdsclient.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	next(t, s)
	// A request for another type.
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(ctx); !errors.Is(err, sdsclient.ErrEnded) || status.Code(s.Err()) != codes.InvalidArgument {
		t.Fatalf("wrong type: %v / %v", err, s.Err())
	}
	if got := testutil.ToFloat64(f.srv.metrics.errors.WithLabelValues(codes.InvalidArgument.String())); got != 5 {
		t.Errorf("errors{InvalidArgument} = %v, want 5", got)
	}
}

func TestManyStreamsOneCSR(t *testing.T) {
	f := newFixture(t, fixtureOpts{ttl: 30 * time.Second, holdManger: true})
	c := f.dial()
	const n = 100
	streams := make([]*sdsclient.Stream, n)
	for i := range streams {
		streams[i] = f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
	}
	testwait.For(t, "the streams to open", func() bool { return testutil.ToFloat64(f.srv.metrics.streams) >= n })
	f.startManager()
	var first []byte
	for _, s := range streams {
		chain := f.checkCert(next(t, s))
		if first == nil {
			first = chain
		} else if !bytes.Equal(chain, first) {
			t.Fatal("streams got different certificates")
		}
	}
	if got := f.dev.Requests(); got != 1 {
		t.Fatalf("%d CSRs for %d streams, want 1", got, n)
	}

	// One rotation reaches every stream.
	f.step(15 * time.Second)
	for _, s := range streams {
		if chain := f.checkCert(next(t, s)); bytes.Equal(chain, first) {
			t.Fatal("rotation pushed the old certificate")
		}
	}
	if got := f.dev.Requests(); got != 2 {
		t.Fatalf("%d CSRs after one rotation, want 2", got)
	}
}

// bigSource serves root-type secrets of 256 KiB under any name it was told
// of, and counts the reads of each name.
type bigSource struct {
	mu      sync.Mutex
	version map[string]uint64
	reads   map[string]int
	subs    map[string]map[chan struct{}]struct{}
}

const bigSecret = 256 << 10

func newBigSource(names ...string) *bigSource {
	b := &bigSource{version: map[string]uint64{}, reads: map[string]int{}, subs: map[string]map[chan struct{}]struct{}{}}
	for _, n := range names {
		b.version[n] = 1
		b.subs[n] = map[chan struct{}]struct{}{}
	}
	return b
}

func (b *bigSource) Secret(_ context.Context, _ pki.Identity, name string) (*secretmanager.Secret, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.version[name]
	if !ok {
		return nil, secretmanager.ErrUnknownResource
	}
	b.reads[name]++
	return &secretmanager.Secret{Name: name, Roots: bytes.Repeat([]byte{byte('a' + v%26)}, bigSecret), Version: v}, nil
}

func (b *bigSource) Current(id pki.Identity, name string) (*secretmanager.Secret, error) {
	return b.Secret(context.Background(), id, name)
}

func (b *bigSource) Watch(_ pki.Identity, name string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.subs[name][ch] = struct{}{}
	return ch, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.subs[name], ch)
	}
}

// bump publishes a new version of name and returns it.
func (b *bigSource) bump(name string) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.version[name]++
	for ch := range b.subs[name] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return b.version[name]
}

func (b *bigSource) readsOf(name string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reads[name]
}

// A client that stops reading fills gRPC's flow-control windows (64 KiB,
// set by the client, with 256 KiB responses): its handler blocks in Send. A
// client of the same server still gets every update meanwhile, and the
// stalled one, once it reads again, catches up with the newest version
// without being sent every version it missed.
func TestStalledStreamDoesNotBlockOthers(t *testing.T) {
	dir := shortDir(t)
	socket := filepath.Join(dir, "sds.sock")
	src := newBigSource("stalled", "live")
	srv, err := New(Config{Secrets: src, MaxStreams: 4096, MaxStreamsPerCaller: 64, MaxFileNamesPerCaller: 16})
	if err != nil {
		t.Fatal(err)
	}
	uds, err := socketServer(srv, udsserver.Config{SocketPath: socket, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- uds.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	// The stalled client: small fixed windows, and nobody calls Recv.
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, stopStalled := context.WithCancel(context.Background())
	defer stopStalled()
	stalled, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(sctx, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := stalled.Send(&discoveryv3.DiscoveryRequest{TypeUrl: secretTypeURL, ResourceNames: []string{"stalled"}}); err != nil {
		t.Fatal(err)
	}

	c, err := sdsclient.Dial(context.Background(), socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	live, err := c.Stream(context.Background(), sdsclient.StreamConfig{Names: []string{"live"}, ManualACK: true})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	next(t, live)

	const updates = 40 // 40 x 256 KiB for the stalled stream: far beyond its windows
	for range updates {
		src.bump("stalled")
		v := src.bump("live")
		for {
			r := next(t, live)
			got, _ := r.TrustedCA("live")
			if len(got) == bigSecret && got[0] == byte('a'+v%26) {
				break
			}
		}
	}
	// Its handler blocked in Send on the first or second response, so it
	// stopped reading its secret: most updates were never even read.
	if n := src.readsOf("stalled"); n > 4 {
		t.Fatalf("the stalled stream's secret was read %d times for %d updates: flow control never filled", n, updates)
	}

	// Reading again: what gRPC had queued, then the newest version.
	want := byte('a' + (updates+1)%26)
	received := 0
	for {
		resp, err := stalled.Recv()
		if err != nil {
			t.Fatalf("stalled stream: %v", err)
		}
		received++
		var sec tlsv3.Secret
		if err := resp.GetResources()[0].UnmarshalTo(&sec); err != nil {
			t.Fatal(err)
		}
		got := sec.GetValidationContext().GetTrustedCa().GetInlineBytes()
		if len(got) == bigSecret && got[0] == want {
			break
		}
		if err := stalled.Send(&discoveryv3.DiscoveryRequest{TypeUrl: secretTypeURL, ResourceNames: []string{"stalled"},
			ResponseNonce: resp.GetNonce(), VersionInfo: resp.GetVersionInfo()}); err != nil {
			t.Fatal(err)
		}
	}
	if received > 5 {
		t.Fatalf("the stalled stream was sent %d responses to catch up, want the queued ones and the newest", received)
	}
}

// A NACK that also changes the names is a subscription change: the new
// names are served.
func TestNACKWithNewNamesIsASubscriptionChange(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	s := f.stream(f.dial(), sdsclient.StreamConfig{Names: []string{"default"}, ManualACK: true})
	r1 := next(t, s)
	err := s.Send(&discoveryv3.DiscoveryRequest{
		TypeUrl: secretTypeURL, ResourceNames: []string{"default", "ROOTCA"},
		ResponseNonce: r1.Nonce, ErrorDetail: &rpcstatus.Status{Code: 3, Message: "bad certificate"},
	})
	if err != nil {
		t.Fatal(err)
	}
	r2 := next(t, s)
	if len(r2.Names) != 2 {
		t.Fatalf("after a NACK naming ROOTCA too the response holds %v, want default and ROOTCA", r2.Names)
	}
	if _, ok := r2.TrustedCA("ROOTCA"); !ok {
		t.Fatal("ROOTCA not served")
	}
	if got := testutil.ToFloat64(f.srv.metrics.nacks); got != 1 {
		t.Errorf("nacks = %v, want 1", got)
	}
}

type staticSource struct{}

func (staticSource) Secret(context.Context, pki.Identity, string) (*secretmanager.Secret, error) {
	return nil, secretmanager.ErrUnknownResource
}

func (staticSource) Current(id pki.Identity, name string) (*secretmanager.Secret, error) {
	return staticSource{}.Secret(context.Background(), id, name)
}

func (staticSource) Watch(pki.Identity, string) (<-chan struct{}, func()) { return nil, func() {} }

// TestNoPrivateKeyOnDisk serves a certificate and then reads every file in
// the places the process may write: its working directory and the temporary
// directory it is given (which holds the socket directory). None may hold the
// key, as PEM or as the DER inside it.
func TestNoPrivateKeyOnDisk(t *testing.T) {
	work, tmp := t.TempDir(), t.TempDir()
	t.Chdir(work)
	t.Setenv("TMPDIR", tmp)
	f := newFixture(t, fixtureOpts{})
	r := next(t, f.stream(f.dial(), sdsclient.StreamConfig{Names: []string{"default"}}))
	f.checkCert(r)
	_, keyPEM, _ := r.Cert(secretmanager.WorkloadCertName)
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		t.Fatal("served key is not PEM")
	}
	if !strings.HasPrefix(f.socket, tmp+string(filepath.Separator)) {
		t.Fatalf("socket %s is outside the temporary directory %s", f.socket, tmp)
	}
	sockets := 0
	for _, root := range []string{work, tmp} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if d.Type()&fs.ModeSocket != 0 {
				sockets++
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte("PRIVATE KEY")) || bytes.Contains(b, block.Bytes) {
				t.Errorf("private key written to %s", path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The walk covered where the server writes: it found its socket.
	if sockets == 0 {
		t.Fatalf("no socket found under %s or %s", work, tmp)
	}
}

func FuzzClassify(f *testing.F) {
	seed := []*discoveryv3.DiscoveryRequest{
		{TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default"}},
		{TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default"}, ResponseNonce: "n1"},
		{ResourceNames: []string{"ROOTCA", "default", "default"}, ResponseNonce: "old"},
		{TypeUrl: resourcev3.ClusterType},
	}
	for _, r := range seed {
		b, _ := proto.Marshal(r)
		f.Add(b, true)
		f.Add(b, false)
	}
	f.Fuzz(func(t *testing.T, data []byte, subscribed bool) {
		req := &discoveryv3.DiscoveryRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		str := &stream{srv: &Server{cfg: Config{Secrets: staticSource{}, MaxStreams: 4096, MaxStreamsPerCaller: 64, MaxFileNamesPerCaller: 16}}, ctx: context.Background()}
		st := &str.st
		if subscribed {
			if err := str.subscribe([]string{"default"}, []string{"default"}); err != nil {
				t.Fatal(err)
			}
			st.nonce = "n1"
		}
		checkClassifyProperties(t, st, req)
		srv := &Server{cfg: Config{MaxNames: DefaultMaxNames, DefaultNames: []string{"default", "ROOTCA"}, MaxStreams: 4096, MaxStreamsPerCaller: 64, MaxFileNamesPerCaller: 16}}
		names, err := srv.names(req.GetResourceNames())
		if err == nil && (len(names) == 0 || len(names) > DefaultMaxNames) {
			t.Fatalf("names %v", names)
		}
		str.unwatchAll()
	})
}

// checkClassifyProperties checks what must hold of classify for any request,
// by comparing its answer to req with its answers to variations of req,
// rather than by computing the answer a second way.
func checkClassifyProperties(t *testing.T, st *streamState, req *discoveryv3.DiscoveryRequest) {
	t.Helper()
	a := st.classify(req)
	if a < actRespond || a > actBadType {
		t.Fatalf("classify answered %d, not an action", a)
	}
	vary := func(change func(r *discoveryv3.DiscoveryRequest)) action {
		r := proto.Clone(req).(*discoveryv3.DiscoveryRequest)
		change(r)
		return st.classify(r)
	}

	// Only the type decides actBadType; an empty type means the stream's own.
	bad := req.GetTypeUrl() != "" && req.GetTypeUrl() != resourcev3.SecretType
	if (a == actBadType) != bad {
		t.Fatalf("type %q classified %d", req.GetTypeUrl(), a)
	}
	if got := vary(func(r *discoveryv3.DiscoveryRequest) { r.TypeUrl = resourcev3.ClusterType }); got != actBadType {
		t.Fatalf("a cluster request classified %d", got)
	}
	if bad {
		return
	}
	if got := vary(func(r *discoveryv3.DiscoveryRequest) { r.TypeUrl = "" }); got != a {
		t.Fatalf("no type classified %d, the secret type %d", got, a)
	}

	// The names count as a set: their order and repeats change nothing.
	if got := vary(func(r *discoveryv3.DiscoveryRequest) {
		slices.Reverse(r.ResourceNames)
		r.ResourceNames = append(r.ResourceNames, r.ResourceNames...)
	}); got != a {
		t.Fatalf("names reversed and repeated classified %d, as sent %d", got, a)
	}

	// A stream that has answered nothing has nothing to acknowledge.
	if !st.subscribed && a != actRespond {
		t.Fatalf("first request classified %d", a)
	}
	// Only a nonce other than the latest is stale; the latest or none never is.
	if a == actStale && (req.GetResponseNonce() == "" || req.GetResponseNonce() == st.nonce) {
		t.Fatalf("nonce %q (latest %q) classified stale", req.GetResponseNonce(), st.nonce)
	}
	for _, nonce := range []string{"", st.nonce} {
		if got := vary(func(r *discoveryv3.DiscoveryRequest) { r.ResponseNonce = nonce }); got == actStale {
			t.Fatalf("nonce %q (latest %q) classified stale", nonce, st.nonce)
		}
	}
	if st.subscribed {
		if got := vary(func(r *discoveryv3.DiscoveryRequest) { r.ResponseNonce = st.nonce + "-other" }); got != actStale {
			t.Fatalf("a nonce other than the latest classified %d", got)
		}
	}

	// ACK and NACK differ only by the error detail, and the names decide
	// between them and a new subscription.
	withError := vary(func(r *discoveryv3.DiscoveryRequest) { r.ErrorDetail = &rpcstatus.Status{Code: 3, Message: "rejected"} })
	withoutError := vary(func(r *discoveryv3.DiscoveryRequest) { r.ErrorDetail = nil })
	switch a {
	case actACK, actNACK:
		if withError != actNACK || withoutError != actACK {
			t.Fatalf("with an error detail %d, without %d: want NACK and ACK", withError, withoutError)
		}
		if got := vary(func(r *discoveryv3.DiscoveryRequest) { r.ResourceNames = append(r.ResourceNames, "other-name") }); got != actRespond {
			t.Fatalf("a name added to an acknowledgement classified %d", got)
		}
	case actRespond:
		if withError != actRespond || withoutError != actRespond {
			t.Fatalf("a subscription change classified %d with an error detail, %d without", withError, withoutError)
		}
	}
}

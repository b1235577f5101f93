package sds

import (
	"bytes"
	"context"
	"fmt"
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
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// ended waits for s to end and returns its gRPC code and message.
func ended(t *testing.T, s *sdsclient.Stream) (codes.Code, string) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("stream did not end")
	}
	st, _ := status.FromError(s.Err())
	return st.Code(), st.Message()
}

func TestMaxStreamsRefusesOverLimit(t *testing.T) {
	f := newFixture(t, fixtureOpts{config: func(c *Config) { c.MaxStreams = 3 }})
	c := f.dial()
	var open []*sdsclient.Stream
	for range 3 {
		s := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
		f.checkCert(next(t, s))
		open = append(open, s)
	}
	over := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
	code, msg := ended(t, over)
	if code != codes.ResourceExhausted || !strings.Contains(msg, "at most 3") {
		t.Fatalf("over-limit stream ended with %v %q, want ResourceExhausted naming the limit", code, msg)
	}
	if got := testutil.ToFloat64(f.srv.metrics.refused.WithLabelValues(refusedStreams)); got != 1 {
		t.Errorf("refused{max_streams} = %v, want 1", got)
	}
	if f.logs.FilterMessage("SDS stream refused: too many streams").Len() != 1 {
		t.Error("refusal not logged")
	}

	// The open streams keep working: a rotation reaches them.
	f.step(30 * time.Minute)
	for _, s := range open {
		f.checkCert(next(t, s))
	}
	// A closed stream frees its place.
	open[0].Close()
	waitMetric(t, f.srv.metrics.streams, 2)
	again := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
	f.checkCert(next(t, again))
}

func TestMaxRecvBytesRefusesLargeRequest(t *testing.T) {
	f := newFixture(t, fixtureOpts{socket: func(c *udsserver.Config) { c.MaxRecvBytes = 1024 }})
	c := f.dial()
	live := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
	f.checkCert(next(t, live))

	big := f.stream(c, sdsclient.StreamConfig{Names: []string{strings.Repeat("x", 2048)}})
	if code, _ := ended(t, big); code != codes.ResourceExhausted {
		t.Fatalf("over-size stream request ended with %v, want ResourceExhausted", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Fetch(ctx, strings.Repeat("y", 2048)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("over-size fetch: %v, want ResourceExhausted", err)
	}
	// Same connection, other stream: still served.
	f.step(30 * time.Minute)
	f.checkCert(next(t, live))
	if _, err := c.Fetch(ctx, "default"); err != nil {
		t.Fatalf("fetch after the refusals: %v", err)
	}
}

// chainOf returns the inline certificate chain of the first resource of a
// raw response.
func chainOf(t *testing.T, resp *discoveryv3.DiscoveryResponse) []byte {
	t.Helper()
	if len(resp.GetResources()) == 0 {
		t.Fatal("response holds no resource")
	}
	var s tlsv3.Secret
	if err := resp.GetResources()[0].UnmarshalTo(&s); err != nil {
		t.Fatal(err)
	}
	return s.GetTlsCertificate().GetCertificateChain().GetInlineBytes()
}

// A stream whose client stops reading (small HTTP/2 windows, so the server's
// sends soon block) must not delay rotations to the other streams, on other
// connections or on its own; when it reads again it is brought to the newest
// version without the ones it missed.
func TestStuckStreamGetsOnlyNewestLater(t *testing.T) {
	const rotations = 80
	f := newFixture(t, fixtureOpts{ttl: 30 * time.Second})
	live := f.stream(f.dial(), sdsclient.StreamConfig{Names: []string{"default"}}) // f.dial waits for the socket
	next(t, live)
	conn, err := grpc.NewClient("unix://"+f.socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	open := func() secretv3.SecretDiscoveryService_StreamSecretsClient {
		s, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default"}}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	stuck := open()     // never read until the end
	neighbour := open() // same connection, read at once
	if _, err := neighbour.Recv(); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, f.srv.metrics.pushes.WithLabelValues(pushRequest), 3)

	// Every rotation reaches the neighbour while the stuck stream's sends
	// block (checked below): the neighbour is never starved.
	var newest []byte
	for range rotations {
		f.step(15 * time.Second)
		newest = f.checkCert(next(t, live))
		resp, err := neighbour.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(chainOf(t, resp), newest) {
			t.Fatal("the stuck stream's neighbour got another certificate than the live stream")
		}
	}
	// The server counts a push after Send returns, which may be after the
	// client has it. A request answered on each live stream proves their
	// handlers counted every earlier push (a handler does one thing at a
	// time).
	if err := live.Request([]string{"default", "ROOTCA"}, "", ""); err != nil {
		t.Fatal(err)
	}
	next(t, live)
	if err := neighbour.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default", "ROOTCA"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := neighbour.Recv(); err != nil {
		t.Fatal(err)
	}
	// Updates sent to the stuck stream: the total less the two live streams'.
	sentStuck := int(testutil.ToFloat64(f.srv.metrics.pushes.WithLabelValues(pushUpdate))) - 2*rotations
	if sentStuck >= rotations-1 {
		t.Fatalf("the stuck stream was sent %d of %d updates; its sends never blocked", sentStuck, rotations)
	}

	// Reading again: what was queued before it blocked, then the newest.
	got := 0
	for {
		resp, err := stuck.Recv()
		if err != nil {
			t.Fatalf("stuck stream after %d responses: %v", got, err)
		}
		got++
		if bytes.Equal(chainOf(t, resp), newest) {
			break
		}
	}
	// The first response, the updates sent, at most one blocked in Send, the newest.
	if got > sentStuck+3 {
		t.Fatalf("stuck stream read %d responses, want at most %d: missed versions were queued", got, sentStuck+3)
	}
	t.Logf("stuck stream: %d updates sent before it blocked, %d responses read, %d versions skipped", sentStuck, got, rotations+1-got)
}

// rootSource serves any name as a trust bundle whose text is the name and
// its version; Bump replaces one.
type rootSource struct {
	mu       sync.Mutex
	versions map[string]uint64
	watchers map[string][]chan struct{}
}

func newRootSource() *rootSource {
	return &rootSource{versions: map[string]uint64{}, watchers: map[string][]chan struct{}{}}
}

func (r *rootSource) Secret(_ context.Context, _ pki.Identity, name string) (*secretmanager.Secret, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := r.versions[name]
	return &secretmanager.Secret{Name: name, Roots: fmt.Appendf(nil, "%s/%d", name, v), Version: v}, nil
}

func (r *rootSource) Current(id pki.Identity, name string) (*secretmanager.Secret, error) {
	return r.Secret(context.Background(), id, name)
}

func (r *rootSource) Watch(_ pki.Identity, name string) (<-chan struct{}, func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := make(chan struct{}, 1)
	r.watchers[name] = append(r.watchers[name], ch)
	return ch, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.watchers[name] = slices.DeleteFunc(r.watchers[name], func(c chan struct{}) bool { return c == ch })
	}
}

func (r *rootSource) Bump(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.versions[name]++
	for _, ch := range r.watchers[name] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Every watched name triggers a push, for one, two and more names (the
// last wait on a reflect.Select rather than a plain select).
func TestChangeOfAnyWatchedNamePushes(t *testing.T) {
	src := newRootSource()
	socket := filepath.Join(shortDir(t), "socket")
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
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	c, err := sdsclient.Dial(dctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	for _, names := range [][]string{{"a"}, {"b", "c"}, {"d", "e", "f", "g"}} {
		s, err := c.Stream(dctx, sdsclient.StreamConfig{Names: names})
		if err != nil {
			t.Fatal(err)
		}
		next(t, s)
		for _, n := range names {
			src.Bump(n)
			r := next(t, s)
			got, _ := r.TrustedCA(n)
			if want := n + "/1"; string(got) != want {
				t.Fatalf("names %v: after a change of %s got %q, want %q", names, n, got, want)
			}
		}
		s.Close()
	}
}

// The bounds a setting configures have no default here: a zero bound is an
// error naming the Config field (internal/app passes the settings' values).
func TestNewRefusesZeroBounds(t *testing.T) {
	t.Parallel()
	for _, field := range []string{"MaxStreams", "MaxStreamsPerCaller", "MaxFileNamesPerCaller"} {
		cfg := Config{Secrets: staticSource{}, MaxStreams: 1, MaxStreamsPerCaller: 1, MaxFileNamesPerCaller: 1}
		switch field {
		case "MaxStreams":
			cfg.MaxStreams = 0
		case "MaxStreamsPerCaller":
			cfg.MaxStreamsPerCaller = 0
		case "MaxFileNamesPerCaller":
			cfg.MaxFileNamesPerCaller = 0
		}
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "Config."+field) {
			t.Errorf("New with %s 0 = %v, want an error naming Config.%s", field, err, field)
		}
	}
}

package workloadapi_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	gsworkloadapi "github.com/spiffe/go-spiffe/v2/workloadapi"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/internal/uds/streamlimit"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/sds"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/sdsclient"
	"github.com/meshagent/meshagent/workloadapi"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testID = pki.SPIFFEIdentity("cluster.local", "ns1", "sa1")

// shortDir is a temporary directory with a path short enough for a Unix
// socket address, removed when the test ends.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "wl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// agent is the serving half of the agent in process: a secret manager on a
// fake clock with an in-process CA, and one socket serving SDS and the
// Workload API.
type agent struct {
	t      testing.TB
	socket string
	clock  *clocktesting.FakeClock
	ca     *localca.CA
	roots  *secretmanager.Roots
	mgr    *secretmanager.Manager
	wl     *workloadapi.Server
	reg    *prometheus.Registry
	logs   *observer.ObservedLogs
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startAgent(t testing.TB, ttl time.Duration, adjust func(*workloadapi.Config)) *agent {
	t.Helper()
	a := &agent{t: t, socket: filepath.Join(shortDir(t), "uds", "socket"), reg: prometheus.NewRegistry()}
	a.clock = clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	var err error
	if a.ca, err = localca.New(localca.Config{Intermediate: true, Now: a.clock.Now}); err != nil {
		t.Fatal(err)
	}
	dev, err := devca.New(devca.Config{CA: a.ca})
	if err != nil {
		t.Fatal(err)
	}
	if a.roots, err = secret.NewRoots(a.ca.RootPEM(), "dev-ca"); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	a.logs = logs
	log := zap.New(core)
	a.mgr, err = secretmanager.New(secretmanager.Config{
		Identity: testID, CA: dev, Roots: a.roots, TTL: ttl,
		Clock: a.clock, Rand: func() float64 { return 0.5 }, Logger: log,
		GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	a.wl = newWorkloadAPI(t, a.mgr, a.reg, log, adjust)
	sdsSrv, err := sds.New(sds.Config{Secrets: a.mgr, Logger: log, Registerer: a.reg, MaxStreams: 4096, MaxStreamsPerCaller: 64, MaxFileNamesPerCaller: 16})
	if err != nil {
		t.Fatal(err)
	}
	uds, err := udsserver.New(udsserver.Config{
		SocketPath: a.socket, Services: []func(*grpc.Server){sdsSrv.Register, a.wl.Register},
		Logger: log, Registerer: a.reg,
		MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	for _, run := range []func(context.Context) error{a.mgr.Run, uds.Run} {
		a.wg.Go(func() {
			if err := run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(func() { cancel(); a.wg.Wait() })
	return a
}

func newWorkloadAPI(t testing.TB, src workloadapi.SecretSource, reg prometheus.Registerer, log *zap.Logger, adjust func(*workloadapi.Config)) *workloadapi.Server {
	t.Helper()
	cfg := workloadapi.Config{Secrets: src, Logger: log, Registerer: reg, MaxStreams: 4096, MaxStreamsPerCaller: 64,
		LimitNames: streamlimit.Names{Max: "MESHAGENT_WORKLOAD_API_MAX_STREAMS", PerCaller: "MESHAGENT_SDS_MAX_STREAMS_PER_POD"}}
	if adjust != nil {
		adjust(&cfg)
	}
	wl, err := workloadapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return wl
}

// serve runs src's Workload API alone on a socket until the test ends.
func serve(t testing.TB, src workloadapi.SecretSource, adjust func(*workloadapi.Config)) (socket string, wl *workloadapi.Server) {
	t.Helper()
	return serveResolved(t, src, adjust, nil)
}

// serveResolved is serve with callers resolved by r.
func serveResolved(t testing.TB, src workloadapi.SecretSource, adjust func(*workloadapi.Config), r caller.Resolver) (socket string, wl *workloadapi.Server) {
	t.Helper()
	socket = filepath.Join(shortDir(t), "socket")
	wl = newWorkloadAPI(t, src, nil, nil, adjust)
	uds, err := udsserver.New(udsserver.Config{SocketPath: socket, Services: []func(*grpc.Server){wl.Register}, Resolver: r, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- uds.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return socket, wl
}

// step advances the fake clock once the manager waits on it.
func (a *agent) step(d time.Duration) {
	a.t.Helper()
	testwait.Step(a.t, a.clock, d)
}

func (a *agent) addr() string { return "unix://" + a.socket }

// source opens a go-spiffe X509Source on the agent's socket.
func source(t testing.TB, addr string) *gsworkloadapi.X509Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src, err := gsworkloadapi.NewX509Source(ctx, gsworkloadapi.WithClientOptions(gsworkloadapi.WithAddr(addr)))
	if err != nil {
		t.Fatalf("go-spiffe X509Source on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}

// handshake runs a TLS handshake between a server configured from one
// source and a client from another, each authorizing the other's SPIFFE ID,
// and returns what each side verified.
func handshake(t *testing.T, server, client *gsworkloadapi.X509Source, want spiffeid.ID) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lis.Close() }()
	served := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			served <- err
			return
		}
		defer func() { _ = c.Close() }()
		tc := tls.Server(c, tlsconfig.MTLSServerConfig(server, server, tlsconfig.AuthorizeID(want)))
		if err := tc.Handshake(); err != nil {
			served <- err
			return
		}
		_, err = io.Copy(tc, io.LimitReader(tc, 5))
		served <- err
	}()
	c, err := tls.Dial("tcp", lis.Addr().String(), tlsconfig.MTLSClientConfig(client, client, tlsconfig.AuthorizeID(want)))
	if err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo over mTLS: %q, %v", buf, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("server side: %v", err)
	}
	peer := c.ConnectionState().PeerCertificates[0]
	if len(peer.URIs) != 1 || peer.URIs[0].String() != want.String() {
		t.Fatalf("client verified %v, want %s", peer.URIs, want)
	}
}

// go-spiffe's X509Source, a client nobody here wrote, gets the SVID from
// the socket SDS is served on, and two sources make an mTLS handshake that
// each side verifies against the bundle it was given.
func TestGoSpiffeX509SourceAndMTLS(t *testing.T) {
	a := startAgent(t, time.Hour, nil)
	srvSrc, cliSrc := source(t, a.addr()), source(t, a.addr())

	svid, err := cliSrc.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	want := spiffeid.RequireFromString(testID.SPIFFEID)
	if svid.ID != want {
		t.Fatalf("SVID %s, want %s", svid.ID, want)
	}
	if _, err := svid.Certificates[0].Verify(x509.VerifyOptions{
		Roots: a.ca.Pool(), Intermediates: pki.CertPool(svid.Certificates[1:]), CurrentTime: a.clock.Now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		t.Fatalf("the SVID does not verify to the CA root: %v", err)
	}
	bundle, err := cliSrc.GetX509BundleForTrustDomain(want.TrustDomain())
	if err != nil {
		t.Fatal(err)
	}
	root, err := pki.ParseCertificates(a.ca.RootPEM())
	if err != nil {
		t.Fatal(err)
	}
	if got := bundle.X509Authorities(); len(got) != 1 || !got[0].Equal(root[0]) {
		t.Fatalf("bundle holds %d certificates, want the CA root", len(got))
	}
	handshake(t, srvSrc, cliSrc, want)

	// The SDS service on the same socket is unaffected.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, a.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Fetch(ctx, "default"); err != nil {
		t.Fatalf("SDS fetch on the shared socket: %v", err)
	}
}

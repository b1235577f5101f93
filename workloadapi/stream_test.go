package workloadapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	gsworkloadapi "github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/internal/uds/streamlimit"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/workloadapi"
)

func waitUpdated(t *testing.T, updated <-chan struct{}) {
	t.Helper()
	select {
	case <-updated:
	case <-time.After(20 * time.Second):
		t.Fatal("the X509Source saw no update")
	}
}

// gathered returns the value of the metric name with labels, 0 if absent.
func gathered(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			return value(m)
		}
	}
	return 0
}

func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

// contextWatcher hands go-spiffe's X.509 context updates to the test.
type contextWatcher struct {
	updates chan *gsworkloadapi.X509Context
}

func (w *contextWatcher) OnX509ContextUpdate(c *gsworkloadapi.X509Context) { w.updates <- c }
func (w *contextWatcher) OnX509ContextWatchError(error)                    {}

// A rotation and a root change reach open go-spiffe clients on the streams
// they already have: no new connection or stream is made.
func TestRotationAndRootChangeOnOpenStream(t *testing.T) {
	a := startAgent(t, time.Hour, nil)
	src := source(t, a.addr())
	first, err := src.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	updated := src.Updated()

	for i := range 3 {
		a.step(31 * time.Minute) // past the renewal at half the hour
		waitUpdated(t, updated)
		svid, err := src.GetX509SVID()
		if err != nil {
			t.Fatal(err)
		}
		if svid.Certificates[0].SerialNumber.Cmp(first.Certificates[0].SerialNumber) == 0 {
			t.Fatalf("rotation %d: the source still holds the first certificate", i+1)
		}
		if got := svid.Certificates[0].NotBefore; got.Before(a.clock.Now().Add(-time.Minute)) {
			t.Fatalf("rotation %d: certificate from %v, want a fresh one", i+1, got)
		}
		first = svid
	}

	// A second root joins the bundle. (X509Source reads its bundles without
	// its lock in go-spiffe v2.8.1, so a read racing an update is a data
	// race: the bundle is followed through go-spiffe's client watcher.)
	client, err := gsworkloadapi.New(callCtx(t), gsworkloadapi.WithAddr(a.addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Close() }()
	w := &contextWatcher{updates: make(chan *gsworkloadapi.X509Context, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan error, 1)
	go func() { watched <- client.WatchX509Context(ctx, w) }()
	defer func() { cancel(); <-watched }()
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	authorities := func() int {
		t.Helper()
		select {
		case c := <-w.updates:
			b, err := c.Bundles.GetX509BundleForTrustDomain(td)
			if err != nil {
				t.Fatal(err)
			}
			return len(b.X509Authorities())
		case <-time.After(20 * time.Second):
			t.Fatal("no update from the Workload API")
			return 0
		}
	}
	if n := authorities(); n != 1 {
		t.Fatalf("first bundle holds %d roots", n)
	}
	other, err := localca.New(localca.Config{Name: "next root"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.roots.Set(append(bytes.Clone(a.ca.RootPEM()), other.RootPEM()...), "test"); err != nil {
		t.Fatal(err)
	}
	if n := authorities(); n != 2 {
		t.Fatalf("after the root change the bundle holds %d roots, want 2", n)
	}
	// The X509Source, on its stream, got it too.
	waitUpdated(t, updated)

	if n := a.logs.FilterMessage("local client connected").Len(); n != 2 {
		t.Fatalf("%d connections were made, want one per client", n)
	}
	if n := gathered(t, a.reg, "meshagent_workloadapi_pushes_total", map[string]string{"method": "FetchX509SVID", "reason": "first"}); n != 2 {
		t.Fatalf("%v streams were opened, want one per client", n)
	}
}

// rawClient is a Workload API client made here, for what go-spiffe never
// sends: calls without the security header, streams that stop reading.
func rawClient(t *testing.T, socket string, opts ...grpc.DialOption) workload.SpiffeWorkloadAPIClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return workload.NewSpiffeWorkloadAPIClient(conn)
}

func withHeader(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "workload.spiffe.io", "true")
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// firstOf opens a stream and returns its first message or error.
func firstOf[T any](stream grpc.ServerStreamingClient[T], err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	return stream.Recv()
}

func TestSecurityHeaderAndUnimplemented(t *testing.T) {
	a := startAgent(t, time.Hour, nil)
	c := rawClient(t, a.socket)
	calls := map[string]func(ctx context.Context) error{
		"FetchX509SVID": func(ctx context.Context) error {
			_, err := firstOf(c.FetchX509SVID(ctx, &workload.X509SVIDRequest{}, grpc.WaitForReady(true)))
			return err
		},
		"FetchX509Bundles": func(ctx context.Context) error {
			_, err := firstOf(c.FetchX509Bundles(ctx, &workload.X509BundlesRequest{}, grpc.WaitForReady(true)))
			return err
		},
		"FetchJWTSVID": func(ctx context.Context) error {
			_, err := c.FetchJWTSVID(ctx, &workload.JWTSVIDRequest{Audience: []string{"x"}}, grpc.WaitForReady(true))
			return err
		},
		"FetchJWTBundles": func(ctx context.Context) error {
			_, err := firstOf(c.FetchJWTBundles(ctx, &workload.JWTBundlesRequest{}, grpc.WaitForReady(true)))
			return err
		},
		"ValidateJWTSVID": func(ctx context.Context) error {
			_, err := c.ValidateJWTSVID(ctx, &workload.ValidateJWTSVIDRequest{Audience: "x", Svid: "y"}, grpc.WaitForReady(true))
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			for _, md := range []metadata.MD{nil, metadata.Pairs("workload.spiffe.io", "false"), metadata.Pairs("workload.spiffe.io", "true", "workload.spiffe.io", "true")} {
				ctx := metadata.NewOutgoingContext(callCtx(t), md)
				err := call(ctx)
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "security header missing") {
					t.Fatalf("metadata %v: %v, want InvalidArgument naming the missing header", md, err)
				}
			}
			err := call(withHeader(callCtx(t)))
			if strings.HasPrefix(name, "FetchX509") {
				if err != nil {
					t.Fatalf("with the header: %v", err)
				}
				return
			}
			if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "X.509-SVIDs only") {
				t.Fatalf("with the header: %v, want Unimplemented saying only X.509-SVIDs are served", err)
			}
		})
	}
	if n := gathered(t, a.reg, "meshagent_workloadapi_refused_total", map[string]string{"reason": "header"}); n != 3*float64(len(calls)) {
		t.Fatalf("refused{header} = %v, want %d", n, 3*len(calls))
	}
}

// FetchX509Bundles answers the bundle keyed by the trust domain's SPIFFE ID.
func TestFetchX509Bundles(t *testing.T) {
	a := startAgent(t, time.Hour, nil)
	c := rawClient(t, a.socket)
	resp, err := firstOf(c.FetchX509Bundles(withHeader(callCtx(t)), &workload.X509BundlesRequest{}, grpc.WaitForReady(true)))
	if err != nil {
		t.Fatal(err)
	}
	root, err := pki.ParseCertificates(a.ca.RootPEM())
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetBundles()["spiffe://cluster.local"]; len(resp.GetBundles()) != 1 || !bytes.Equal(got, root[0].Raw) {
		t.Fatalf("bundles %v, want the CA root under spiffe://cluster.local", slices.Collect(func(yield func(string) bool) {
			for k := range resp.GetBundles() {
				if !yield(k) {
					return
				}
			}
		}))
	}
}

// source is a SecretSource for tests: "default" and "ROOTCA" from fixed
// material, versions set by the test, and watch signals the test sends,
// with or without a change.
type testSource struct {
	mu       sync.Mutex
	cert     secretmanager.Secret
	root     secretmanager.Secret
	err      error
	watchers map[string][]chan struct{}
}

func newTestSource(t *testing.T, id pki.Identity) *testSource {
	t.Helper()
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.SignCSR(csr, id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return &testSource{
		cert:     secretmanager.Secret{Name: "default", Identity: id, CertChain: pki.EncodeCertificates(chain), PrivateKey: keyPEM, Version: 1},
		root:     rootSecret(t, ca.RootPEM(), 2),
		watchers: map[string][]chan struct{}{},
	}
}

func (s *testSource) Secret(_ context.Context, _ pki.Identity, name string) (*secretmanager.Secret, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	switch name {
	case "default":
		c := s.cert
		return &c, nil
	case "ROOTCA":
		r := s.root
		return &r, nil
	}
	return nil, secretmanager.ErrUnknownResource
}

func (s *testSource) Watch(_ pki.Identity, name string) (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{}, 1)
	s.watchers[name] = append(s.watchers[name], ch)
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.watchers[name] = slices.DeleteFunc(s.watchers[name], func(c chan struct{}) bool { return c == ch })
	}
}

func (s *testSource) watching(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers[name])
}

// signal wakes the watchers of name, after bump (if any) changed the
// source under its lock.
func (s *testSource) signal(name string, bump func(*testSource)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if bump != nil {
		bump(s)
	}
	for _, ch := range s.watchers[name] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// A stream is sent again only when a version changed: a signal without a
// change sends nothing, so the next message is the next version.
func TestOnlyChangesAreSent(t *testing.T) {
	src := newTestSource(t, testID)
	socket, _ := serve(t, src, nil)
	c := rawClient(t, socket)
	stream, err := c.FetchX509SVID(withHeader(callCtx(t)), &workload.X509SVIDRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the stream's watches", func() bool { return src.watching("default") == 1 && src.watching("ROOTCA") == 1 })
	src.signal("default", nil)
	src.signal("ROOTCA", nil)
	other, err := localca.New(localca.Config{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	src.signal("ROOTCA", func(s *testSource) { s.root = rootSecret(t, other.RootPEM(), 3) })
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	root, _ := pki.ParseCertificates(other.RootPEM())
	if !bytes.Equal(resp.GetSvids()[0].GetBundle(), root[0].Raw) {
		t.Fatal("the message after signals without a change is not the changed bundle")
	}
}

// Identities that are not SPIFFE IDs (Linkerd's DNS names) are refused with
// PermissionDenied saying why, as is a name the source will never serve to
// the caller; a source that cannot serve now gives Unavailable. The SPIFFE
// Workload Endpoint standard's codes: clients retry both with backoff.
func TestRefusedIdentities(t *testing.T) {
	t.Run("linkerd", func(t *testing.T) {
		src := newTestSource(t, pki.LinkerdIdentity("cluster.local", "ns1", "sa1", "linkerd"))
		socket, _ := serve(t, src, nil)
		c := rawClient(t, socket)
		for name, err := range map[string]error{
			"FetchX509SVID":    second(firstOf(c.FetchX509SVID(withHeader(callCtx(t)), &workload.X509SVIDRequest{}, grpc.WaitForReady(true)))),
			"FetchX509Bundles": second(firstOf(c.FetchX509Bundles(withHeader(callCtx(t)), &workload.X509BundlesRequest{}, grpc.WaitForReady(true)))),
		} {
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "serves SPIFFE identities") ||
				!strings.Contains(err.Error(), "sa1.ns1.serviceaccount.identity.linkerd.cluster.local") {
				t.Fatalf("%s: %v, want PermissionDenied naming the DNS identity", name, err)
			}
		}
	})
	t.Run("unknown resource", func(t *testing.T) {
		src := newTestSource(t, testID)
		src.err = fmt.Errorf("%w: \"default\"", secretmanager.ErrUnknownResource)
		socket, _ := serve(t, src, nil)
		c := rawClient(t, socket)
		_, err := firstOf(c.FetchX509SVID(withHeader(callCtx(t)), &workload.X509SVIDRequest{}, grpc.WaitForReady(true)))
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "unknown resource") {
			t.Fatalf("%v, want PermissionDenied with the reason", err)
		}
	})
	t.Run("unavailable", func(t *testing.T) {
		src := newTestSource(t, testID)
		src.err = errors.New("CA unreachable")
		socket, _ := serve(t, src, nil)
		c := rawClient(t, socket)
		_, err := firstOf(c.FetchX509SVID(withHeader(callCtx(t)), &workload.X509SVIDRequest{}, grpc.WaitForReady(true)))
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "CA unreachable") {
			t.Fatalf("%v, want Unavailable with the reason", err)
		}
	})
}

func second[T any](_ T, err error) error { return err }

// podResolver names every new connection's caller after the pod set last.
type podResolver struct {
	mu  sync.Mutex
	pod string
}

func (r *podResolver) set(pod string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pod = pod
}

func (r *podResolver) Resolve(_ context.Context, cred caller.Cred) (caller.Info, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return caller.Info{Cred: cred, Identity: testID, Pod: "ns1/" + r.pod, PodUID: "uid-" + r.pod}, nil
}

// Streams are bounded in all, and per pod when callers are resolved to
// pods; a closed stream frees its place.
func TestStreamLimits(t *testing.T) {
	open := func(t *testing.T, c workload.SpiffeWorkloadAPIClient) (context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(withHeader(callCtx(t)))
		_, err := firstOf(c.FetchX509SVID(ctx, &workload.X509SVIDRequest{}, grpc.WaitForReady(true)))
		if err != nil {
			cancel()
		}
		return cancel, err
	}
	openN := func(t *testing.T, c workload.SpiffeWorkloadAPIClient, n int) []context.CancelFunc {
		var cancels []context.CancelFunc
		for range n {
			cancel, err := open(t, c)
			if err != nil {
				t.Fatal(err)
			}
			cancels = append(cancels, cancel)
		}
		t.Cleanup(func() {
			for _, cancel := range cancels {
				cancel()
			}
		})
		return cancels
	}

	t.Run("all callers", func(t *testing.T) {
		src := newTestSource(t, testID)
		socket, _ := serve(t, src, func(c *workloadapi.Config) { c.MaxStreams, c.MaxStreamsPerCaller = 3, 1 })
		c := rawClient(t, socket)
		cancels := openN(t, c, 3) // one workload: the per-caller bound does not apply
		_, err := open(t, c)
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "at most 3 are served at once") {
			t.Fatalf("fourth stream: %v, want ResourceExhausted naming the limit", err)
		}
		cancels[0]()
		testwait.For(t, "the closed stream's place", func() bool { return src.watching("default") == 2 })
		openN(t, c, 1)
	})

	t.Run("per pod", func(t *testing.T) {
		src := newTestSource(t, testID)
		r := &podResolver{}
		socket, _ := serveResolved(t, src, func(c *workloadapi.Config) { c.MaxStreams, c.MaxStreamsPerCaller = 10, 3 }, r)
		r.set("greedy")
		greedy := rawClient(t, socket)
		cancels := openN(t, greedy, 3)
		_, err := open(t, greedy)
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "from this caller: at most 3") {
			t.Fatalf("fourth stream of one pod: %v, want ResourceExhausted naming the per-caller limit", err)
		}
		testwait.For(t, "the greedy pod's connection", func() bool { return src.watching("default") == 3 })
		r.set("other")
		openN(t, rawClient(t, socket), 3) // another pod is served in full
		cancels[0]()
		testwait.For(t, "the closed stream's place", func() bool { return src.watching("default") == 5 })
		openN(t, greedy, 1)
	})

	t.Run("per pod, with its SDS streams", func(t *testing.T) {
		// The SDS server shares the per-pod count: a pod holding 2 SDS
		// streams gets one Workload API stream of its 3.
		var callers streamlimit.Callers
		sds := &streamlimit.Limit{Max: 10, PerCaller: 3, Callers: &callers}
		for range 2 {
			release, err := sds.Acquire("pod:uid-both")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(release)
		}
		src := newTestSource(t, testID)
		r := &podResolver{}
		socket, _ := serveResolved(t, src, func(c *workloadapi.Config) {
			c.MaxStreams, c.MaxStreamsPerCaller, c.Callers = 10, 3, &callers
		}, r)
		r.set("both")
		c := rawClient(t, socket)
		openN(t, c, 1)
		_, err := open(t, c)
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "MESHAGENT_SDS_MAX_STREAMS_PER_POD") {
			t.Fatalf("a fourth stream of the pod, SDS and Workload API together: %v, want ResourceExhausted naming the setting", err)
		}
	})
}

// A client that stops reading fills its flow-control windows and blocks
// only its own stream: the others on its connection and elsewhere get every
// change.
func TestStuckStreamDoesNotDelayOthers(t *testing.T) {
	src := newTestSource(t, testID)
	// A bundle of ~60 KB makes each message large, so the stuck stream's
	// windows fill after a few changes.
	src.root = rootSecret(t, bytes.Repeat(src.root.Roots, 100), src.root.Version)
	socket, _ := serve(t, src, nil)
	small := rawClient(t, socket, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ctx := withHeader(callCtx(t))
	stuck, err := small.FetchX509SVID(ctx, &workload.X509SVIDRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	neighbour, err := small.FetchX509SVID(ctx, &workload.X509SVIDRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	live, err := rawClient(t, socket).FetchX509SVID(ctx, &workload.X509SVIDRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []grpc.ServerStreamingClient[workload.X509SVIDResponse]{neighbour, live} {
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, "three watching streams", func() bool { return src.watching("ROOTCA") == 3 })
	const changes = 30
	for v := range changes {
		version := uint64(10 + v)
		src.signal("ROOTCA", func(s *testSource) { s.root.Version = version })
		for _, s := range []grpc.ServerStreamingClient[workload.X509SVIDResponse]{neighbour, live} {
			if _, err := s.Recv(); err != nil {
				t.Fatalf("change %d: %v", v, err)
			}
		}
	}
	// The stuck stream, read at last, is still served.
	if _, err := stuck.Recv(); err != nil {
		t.Fatal(err)
	}
}

// A caller the agent has no identity for (node mode: no own identity, and
// the caller carries none) gets PermissionDenied, the standard's "not
// entitled to an SVID", through go-spiffe's own client: not Unavailable,
// which would say the agent itself is down.
func TestNoIdentityIsPermissionDenied(t *testing.T) {
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := devca.New(devca.Config{CA: ca})
	if err != nil {
		t.Fatal(err)
	}
	roots, err := secret.NewRoots(ca.RootPEM(), "dev-ca")
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := secretmanager.New(secretmanager.Config{CA: dev, Roots: roots, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}) // node mode: no own identity
	if err != nil {
		t.Fatal(err)
	}
	socket, _ := serve(t, mgr, nil)
	ctx := callCtx(t)
	c, err := gsworkloadapi.New(ctx, gsworkloadapi.WithAddr("unix://"+socket),
		// The socket may not listen yet: wait for it rather than fail.
		gsworkloadapi.WithDialOptions(grpc.WithDefaultCallOptions(grpc.WaitForReady(true))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.FetchX509SVID(ctx)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "no workload identity for this caller") {
		t.Fatalf("go-spiffe FetchX509SVID = %v, want PermissionDenied saying the caller has no identity", err)
	}
	_, err = c.FetchX509Bundles(ctx)
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("go-spiffe FetchX509Bundles = %v, want PermissionDenied", err)
	}
}

// rootSecret is the ROOTCA secret of PEM roots at version v.
func rootSecret(t *testing.T, roots []byte, v uint64) secretmanager.Secret {
	t.Helper()
	b, err := pki.ParseBundle(roots)
	if err != nil {
		t.Fatal(err)
	}
	s := secret.RootSecret(secretmanager.RootCertName, b, "test")
	s.Version = v
	return *s
}

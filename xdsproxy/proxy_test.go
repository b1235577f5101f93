package xdsproxy

import (
	"context"
	"crypto/sha256"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/xdsserver"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestForwardsClustersAndListenersWithCredentials(t *testing.T) {
	r := newRig(t, rigOptions{requireClientCA: true, withClientCert: true})
	setClusters(t, r.up, "v1", "outbound|80||a.default.svc.cluster.local", "outbound|80||b.default.svc.cluster.local")

	if err := r.proxy.Ready(); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Ready before any answer = %v, want ErrNotReady", err)
	}
	c := newSotwClient(t, dialSocket(t, r.socket))
	c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	cds := c.next(5 * time.Second)
	if cds.TypeUrl != resource.ClusterType || cds.VersionInfo != "v1" || len(cds.Resources) != 2 {
		t.Fatalf("CDS response: type %s version %s, %d resources", cds.TypeUrl, cds.VersionInfo, len(cds.Resources))
	}
	var names []string
	for _, a := range cds.Resources {
		var cl cluster.Cluster
		if err := a.UnmarshalTo(&cl); err != nil {
			t.Fatal(err)
		}
		names = append(names, cl.Name)
	}
	slices.Sort(names)
	if names[0] != "outbound|80||a.default.svc.cluster.local" || names[1] != "outbound|80||b.default.svc.cluster.local" {
		t.Fatalf("clusters = %v", names)
	}
	c.ack(cds, nil)
	c.send(&discovery.DiscoveryRequest{TypeUrl: resource.ListenerType})
	lds := c.next(5 * time.Second)
	if lds.TypeUrl != resource.ListenerType || len(lds.Resources) != 1 {
		t.Fatalf("LDS response: type %s, %d resources", lds.TypeUrl, len(lds.Resources))
	}
	c.ack(lds, nil)

	if err := r.proxy.Ready(); err != nil {
		t.Fatalf("Ready after an answer: %v", err)
	}
	md := r.up.LastMetadata()
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+testToken {
		t.Errorf("authorization at the control plane = %q", got)
	}
	if got := md.Get("ClusterID"); len(got) != 1 || got[0] != testClusterID {
		t.Errorf("ClusterID at the control plane = %q", got)
	}
	if got := md.Get("x-mesh-header"); len(got) != 1 || got[0] != "from-env" {
		t.Errorf("extra header at the control plane = %q", got)
	}
	calls := r.up.Calls()
	if len(calls) != 1 {
		t.Fatalf("control plane saw %d streams, want 1", len(calls))
	}
	if pc := calls[0].PeerCertificates; len(pc) == 0 || len(pc[0].URIs) != 1 ||
		pc[0].URIs[0].String() != "spiffe://cluster.local/ns/default/sa/app-1" {
		t.Errorf("client certificate at the control plane: %v", pc)
	}
	// Requests arrive exactly as the client sent them.
	testwait.For(t, "the last ACK upstream", func() bool {
		return len(r.up.Calls()[0].Requests) == len(c.sent)
	})
	for i, got := range r.up.Calls()[0].Requests {
		if !proto.Equal(got, c.sent[i]) {
			t.Errorf("request %d upstream = %v, want %v", i, got, c.sent[i])
		}
	}
	if v := r.counter("messages", toDownstream); v != 2 {
		t.Errorf("messages to downstream = %v, want 2", v)
	}
	if v := r.counter("messages", toUpstream); v != 4 {
		t.Errorf("messages to upstream = %v, want 4", v)
	}
	if v := r.counter("bytes", toDownstream); v < float64(proto.Size(cds)+proto.Size(lds)) {
		t.Errorf("bytes to downstream = %v, want at least %d", v, proto.Size(cds)+proto.Size(lds))
	}
	if v := r.counter("connects"); v != 1 {
		t.Errorf("connects = %v, want 1", v)
	}
	if v := r.counter("streams", protoSotw); v != 1 {
		t.Errorf("downstream streams = %v, want 1", v)
	}
}

func TestUpstreamRestartsDoNotEndDownstream(t *testing.T) {
	r := newRig(t, rigOptions{})
	setClusters(t, r.up, "v0", "c0")
	c := newSotwClient(t, dialSocket(t, r.socket))
	c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	c.untilVersion(resource.ClusterType, "v0", 5*time.Second)

	const restarts = 10
	for i := 1; i <= restarts; i++ {
		prev := "v" + itoa(i-1)
		// The proxy has seen the client's ACK of the previous version.
		testwait.For(t, "the ACK of "+prev, func() bool {
			calls := r.up.Calls()
			reqs := calls[len(calls)-1].Requests
			return len(reqs) > 0 && reqs[len(reqs)-1].VersionInfo == prev
		})
		r.up.Restart(t)
		version := "v" + itoa(i)
		setClusters(t, r.up, version, "c0", "c"+itoa(i))
		resp := c.untilVersion(resource.ClusterType, version, 5*time.Second)
		if len(resp.Resources) != 2 {
			t.Fatalf("%s: %d resources, want 2", version, len(resp.Resources))
		}
		// The new upstream stream began with the re-sent subscription.
		calls := r.up.Calls()
		first := calls[len(calls)-1].Requests[0]
		if first.GetNode().GetId() != testNodeID || first.ResponseNonce != "" ||
			first.TypeUrl != resource.ClusterType || first.VersionInfo != prev {
			t.Fatalf("after restart %d the first request was %v; want node, no nonce, version %s", i, first, prev)
		}
	}
	if err := c.streamErr(); err != nil {
		t.Fatalf("downstream stream broke: %v", err)
	}
	if got := r.counter("reconnects"); got < restarts {
		t.Errorf("reconnects = %v, want at least %d", got, restarts)
	}
	if got := r.counter("streams", protoSotw); got != 1 {
		t.Errorf("downstream streams = %v, want 1", got)
	}
}

func TestLargeResponseArrivesIntact(t *testing.T) {
	size := 100 << 20
	if testing.Short() || raceEnabled {
		size = 20 << 20
	}
	r := newRig(t, rigOptions{})
	clusters := bigClusters(size, 1<<20)
	want := map[string][32]byte{}
	for _, res := range clusters {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		want[res.(*cluster.Cluster).Name] = sha256.Sum256(b)
	}
	if err := r.up.SetResources(testNodeID, "big-1", map[resource.Type][]types.Resource{resource.ClusterType: clusters}); err != nil {
		t.Fatal(err)
	}
	c := newSotwClient(t, dialSocket(t, r.socket))
	c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	resp := c.next(30 * time.Second)
	if len(resp.Resources) != len(want) {
		t.Fatalf("got %d resources, want %d", len(resp.Resources), len(want))
	}
	got := map[string][32]byte{}
	total := 0
	for _, a := range resp.Resources {
		var cl cluster.Cluster
		if err := a.UnmarshalTo(&cl); err != nil {
			t.Fatal(err)
		}
		got[cl.Name] = sha256.Sum256(a.Value)
		total += len(a.Value)
	}
	for name, h := range want {
		if got[name] != h {
			t.Fatalf("resource %s differs after the proxy", name)
		}
	}
	if total < size {
		t.Fatalf("received %d bytes of resources, want at least %d", total, size)
	}
	if v := r.counter("bytes", toDownstream); v < float64(size) {
		t.Errorf("bytes to downstream = %v, want at least %d", v, size)
	}
	t.Logf("forwarded one response of %d bytes", proto.Size(resp))
}

func TestDeltaSubscribeReceiveUnsubscribe(t *testing.T) {
	r := newRig(t, rigOptions{})
	setClusters(t, r.up, "v1", "c1", "c2")
	conn := dialSocket(t, r.socket)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resps := make(chan *discovery.DeltaDiscoveryResponse, 16)
	recvErr := make(chan error, 1)
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				recvErr <- err
				close(resps)
				return
			}
			resps <- resp
		}
	}()
	next := func() *discovery.DeltaDiscoveryResponse {
		t.Helper()
		select {
		case resp, ok := <-resps:
			if !ok {
				t.Fatalf("delta stream ended: %v", <-recvErr)
			}
			if err := st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.TypeUrl, ResponseNonce: resp.Nonce}); err != nil {
				t.Fatal(err)
			}
			return resp
		case <-time.After(5 * time.Second):
			t.Fatal("no delta response")
			return nil
		}
	}
	names := func(resp *discovery.DeltaDiscoveryResponse) []string {
		var out []string
		for _, res := range resp.Resources {
			out = append(out, res.Name)
		}
		slices.Sort(out)
		return out
	}
	send := func(req *discovery.DeltaDiscoveryRequest) {
		t.Helper()
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}

	send(&discovery.DeltaDiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"c1"}})
	if got := names(next()); !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("first delta response = %v, want [c1]", got)
	}
	send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"c2"}})
	if got := names(next()); !slices.Equal(got, []string{"c2"}) {
		t.Fatalf("after subscribing c2 = %v, want [c2]", got)
	}
	send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNamesUnsubscribe: []string{"c1"}})
	// Both change; only c2 is still wanted.
	testwait.For(t, "the unsubscribe upstream", func() bool {
		reqs := r.up.Calls()[0].DeltaRequests
		return len(reqs) > 0 && len(reqs[len(reqs)-1].ResourceNamesUnsubscribe) == 1
	})
	setResources(t, r.up, "v2", clusterWithPort("c1", 1), clusterWithPort("c2", 1))
	if got := names(next()); !slices.Equal(got, []string{"c2"}) {
		t.Fatalf("after unsubscribing c1 = %v, want [c2]", got)
	}
	testwait.For(t, "the ACK upstream", func() bool {
		reqs := r.up.Calls()[0].DeltaRequests
		return len(reqs) > 0 && reqs[len(reqs)-1].ResponseNonce != ""
	})

	// The control plane restarts: the new stream is told what the client
	// holds, so nothing is sent again until something changes.
	r.up.Restart(t)
	testwait.For(t, "the new upstream stream", func() bool {
		calls := r.up.Calls()
		return len(calls) == 2 && len(calls[1].DeltaRequests) > 0
	})
	first := r.up.Calls()[1].DeltaRequests[0]
	if first.GetNode().GetId() != testNodeID || !slices.Equal(first.ResourceNamesSubscribe, []string{"c2"}) ||
		len(first.InitialResourceVersions) != 1 || first.InitialResourceVersions["c2"] == "" || first.ResponseNonce != "" {
		t.Fatalf("re-sent delta subscription = %v", first)
	}
	setResources(t, r.up, "v3", clusterWithPort("c1", 2), clusterWithPort("c2", 2))
	if got := names(next()); !slices.Equal(got, []string{"c2"}) {
		t.Fatalf("after the restart = %v, want [c2]", got)
	}
	select {
	case resp := <-resps:
		t.Fatalf("unexpected extra delta response with %v", names(resp))
	case <-time.After(100 * time.Millisecond):
	}
	if got := r.counter("streams", protoDelta); got != 1 {
		t.Errorf("delta streams = %v, want 1", got)
	}
	cancel()
	<-recvErr
}

func clusterWithPort(name string, n uint32) types.Resource {
	c := makeCluster(name)
	c.PerConnectionBufferLimitBytes = wrapU32(n)
	return c
}

func setResources(t testing.TB, up *xdsserver.Server, version string, clusters ...types.Resource) {
	t.Helper()
	if err := up.SetResources(testNodeID, version, map[resource.Type][]types.Resource{resource.ClusterType: clusters}); err != nil {
		t.Fatal(err)
	}
}

func TestDownstreamCloseCancelsUpstream(t *testing.T) {
	r := newRig(t, rigOptions{})
	setClusters(t, r.up, "v1", "c1")
	c := newSotwClient(t, dialSocket(t, r.socket))
	c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	c.next(5 * time.Second)
	if got := r.up.Streams().Active; got != 1 {
		t.Fatalf("active upstream streams = %d, want 1", got)
	}
	c.close()
	if !r.up.WaitStreams(5*time.Second, func(n xdsserver.Counts) bool { return n.Active == 0 }) {
		t.Fatal("the upstream stream outlived the downstream one")
	}
	testwait.For(t, "the stream gauge", func() bool { return r.counter("streams", protoSotw) == 0 })
	if got := r.up.Streams().Opened; got != 1 {
		t.Errorf("upstream streams opened = %d, want 1", got)
	}
}

func TestRefusesUntrustedControlPlane(t *testing.T) {
	r := newRig(t, rigOptions{upstreamCA: newCA(t)})
	setClusters(t, r.up, "v1", "c1")
	c := newSotwClient(t, dialSocket(t, r.socket))
	c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	testwait.For(t, "several failed attempts", func() bool { return r.totalFailures() >= 3 })
	if got := r.tokens.calls.Load(); got != 0 {
		t.Errorf("token fetched %d times for an unverified control plane", got)
	}
	if n := r.up.Streams(); n.Opened != 0 {
		t.Errorf("control plane saw %+v", n)
	}
	if got := r.up.Calls(); len(got) != 0 {
		t.Errorf("control plane recorded %d calls", len(got))
	}
	err := r.proxy.Ready()
	if !errors.Is(err, ErrNotReady) {
		t.Errorf("Ready = %v, want ErrNotReady", err)
	}
	if got := r.counter("failures", codes.Unavailable.String()); got < 3 {
		t.Errorf("Unavailable failures = %v", got)
	}
	if err := c.streamErr(); err != nil {
		t.Errorf("downstream stream ended: %v", err)
	}
	t.Logf("Ready: %v", err)
}

func TestWrongTokenIsRetried(t *testing.T) {
	r := newRig(t, rigOptions{tweak: func(cfg *Config) {
		cfg.Upstream.Token = &countingFetcher{inner: staticToken("not-the-token")}
	}})
	setClusters(t, r.up, "v1", "c1")
	c := newSotwClient(t, dialSocket(t, r.socket))
	c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	testwait.For(t, "rejected attempts", func() bool {
		return r.counter("failures", codes.Unauthenticated.String()) >= 2
	})
	if n := r.up.Streams(); n.Rejected < 2 || n.Active != 0 {
		t.Errorf("control plane counts %+v", n)
	}
	if err := r.proxy.Ready(); !errors.Is(err, ErrNotReady) {
		t.Errorf("Ready = %v", err)
	}
	if err := c.streamErr(); err != nil {
		t.Errorf("downstream stream ended: %v", err)
	}
}

type staticToken string

func (s staticToken) Token(context.Context) (string, error) { return string(s), nil }

func TestPlaintextLoopbackUpstream(t *testing.T) {
	up := xdsserver.Start(t, xdsserver.Config{Plaintext: true, Tokens: []string{testToken}})
	setClusters(t, up, "v1", "c1")
	p, err := New(Config{
		SocketPath:     filepath.Join(t.TempDir(), "XDS"),
		Upstream:       controlplane.Config{Addr: up.Addr(), Plaintext: true, Token: staticToken(testToken)},
		InitialBackoff: 5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runProxy(t, p)
	c := newSotwClient(t, dialSocket(t, p.SocketPath()))
	c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	if resp := c.next(5 * time.Second); resp.VersionInfo != "v1" {
		t.Fatalf("version %s", resp.VersionInfo)
	}
}

func TestPort15010MeansPlaintext(t *testing.T) {
	tests := []struct {
		name          string
		addr          string
		wantPlaintext bool
		wantToken     bool
	}{
		{"istiod plaintext port", "istiod.istio-system.svc:15010", true, false},
		{"loopback plaintext port", "127.0.0.1:15010", true, true},
		{"istiod TLS port", "istiod.istio-system.svc:15012", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{SocketPath: "XDS", Upstream: controlplane.Config{Addr: tt.addr, Token: staticToken("t")}})
			if err != nil {
				t.Fatal(err)
			}
			if p.upstream.Plaintext != tt.wantPlaintext || (p.upstream.Token != nil) != tt.wantToken {
				t.Errorf("plaintext %v token %v, want %v %v", p.upstream.Plaintext, p.upstream.Token != nil, tt.wantPlaintext, tt.wantToken)
			}
		})
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New without an address succeeded")
	}
}

func TestMalformedRequestEndsStreamWithInvalidArgument(t *testing.T) {
	r := newRig(t, rigOptions{})
	conn := dialSocket(t, r.socket)
	tests := []struct {
		name string
		send *frame
	}{
		{"not protobuf", bytesFrame([]byte{0xff, 0xff, 0xff})},
		{"no type URL", bytesFrame(mustMarshal(t, &discovery.DiscoveryRequest{Node: testNode()}))},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := conn.NewStream(ctx, sotwProtocol.desc, sotwProtocol.method, grpc.ForceCodecV2(rawCodec{}))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.SendMsg(tt.send); err != nil {
				t.Fatal(err)
			}
			var f frame
			err = st.RecvMsg(&f)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("stream ended with %v, want InvalidArgument", err)
			}
			if got := r.counter("rejected"); got != float64(i+1) {
				t.Errorf("rejected = %v, want %d", got, i+1)
			}
		})
	}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSocketSetup(t *testing.T) {
	dir := t.TempDir()
	t.Run("creates the directory and removes the socket on shutdown", func(t *testing.T) {
		path := filepath.Join(dir, "a", "etc", "istio", "proxy", "XDS")
		p, err := New(Config{SocketPath: path, Upstream: controlplane.Config{Addr: "127.0.0.1:1"}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		testwait.For(t, "the socket", func() bool { _, err := os.Stat(path); return err == nil })
		fi, err := os.Stat(filepath.Dir(path))
		if err != nil || fi.Mode().Perm() != socketDirMode {
			t.Errorf("socket directory: %v %v", fi.Mode(), err)
		}
		if err := p.Run(ctx); err == nil {
			t.Error("second Run succeeded")
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket left behind: %v", err)
		}
	})
	t.Run("leaves a socket that replaced its own", func(t *testing.T) {
		path := filepath.Join(dir, "b", "XDS")
		p, err := New(Config{SocketPath: path, Upstream: controlplane.Config{Addr: "127.0.0.1:1"}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		testwait.Within(t, 5*time.Second, "the socket", func() bool { _, err := os.Stat(path); return err == nil })
		// Another process's socket takes the path.
		takeOver := func(name string) os.FileInfo {
			tmp := path + "." + name
			other, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			other.SetUnlinkOnClose(false)
			t.Cleanup(func() { other.Close() })
			// Its identity is taken before the rename: the proxy may bind its
			// own again before a look at the path after it.
			fi, err := os.Lstat(tmp)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
			return fi
		}
		// The first time, the proxy binds its own again at once (it
		// watches the directory); after a rebind it looks again only
		// after its check interval (5 s), so the second one holds the
		// path when the proxy stops.
		first := takeOver("first")
		// At once with an inotify watch; within the check interval (5 s) when
		// none can be had (another test may hold every inotify instance).
		testwait.Within(t, 10*time.Second, "the proxy's socket bound again", func() bool {
			now, err := os.Lstat(path)
			return err == nil && !os.SameFile(now, first)
		})
		theirs := takeOver("second")
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if now, err := os.Lstat(path); err != nil || !os.SameFile(now, theirs) {
			t.Fatalf("the other process's socket was removed or replaced on shutdown: %v", err)
		}
	})
	t.Run("replaces a stale socket", func(t *testing.T) {
		path := filepath.Join(dir, "stale")
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		_ = l.Close()
		p, err := New(Config{SocketPath: path, Upstream: controlplane.Config{Addr: "127.0.0.1:1"}})
		if err != nil {
			t.Fatal(err)
		}
		runProxy(t, p)
	})
	t.Run("refuses a live socket", func(t *testing.T) {
		path := filepath.Join(dir, "live")
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		p, err := New(Config{SocketPath: path, Upstream: controlplane.Config{Addr: "127.0.0.1:1"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Run(context.Background()); !errors.Is(err, ErrSocketInUse) {
			t.Fatalf("Run = %v, want ErrSocketInUse", err)
		}
	})
	t.Run("refuses a regular file", func(t *testing.T) {
		path := filepath.Join(dir, "file")
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := New(Config{SocketPath: path, Upstream: controlplane.Config{Addr: "127.0.0.1:1"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Run(context.Background()); !errors.Is(err, ErrNotSocket) {
			t.Fatalf("Run = %v, want ErrNotSocket", err)
		}
	})
}

func TestBackoffFollowsTheClock(t *testing.T) {
	// A port nobody listens on: every attempt fails at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	clk := clocktesting.NewFakeClock(time.Now())
	r := newRig(t, rigOptions{tweak: func(cfg *Config) {
		cfg.Upstream.Addr = addr
		cfg.Clock = clk
		cfg.Rand = func() float64 { return 0 } // delay = half the step
		cfg.InitialBackoff = time.Second
		cfg.MaxBackoff = 4 * time.Second
	}})
	c := newSotwClient(t, dialSocket(t, r.socket))
	c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})

	// Waits: 0.5s, 1s, 2s, then capped at 2s (half of 4s).
	for i, wait := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second} {
		testwait.For(t, "a failed attempt", func() bool { return r.totalFailures() == float64(i+1) })
		testwait.Timer(t, clk)
		// One millisecond short of the backoff, its timer must still be
		// set: had it fired, Step would have removed it (the next attempt
		// sets a new one only after a dial, which this check does not wait
		// for).
		clk.Step(wait - time.Millisecond)
		if !clk.HasWaiters() || r.totalFailures() != float64(i+1) {
			t.Fatalf("attempt %d was not held back for its backoff of %v", i+2, wait)
		}
		clk.Step(time.Millisecond)
	}
	testwait.For(t, "the last attempt", func() bool { return r.totalFailures() == 5 })
	if err := c.streamErr(); err != nil {
		t.Fatalf("downstream stream ended: %v", err)
	}
}

func TestSeveralClientsEachGetTheirOwnUpstream(t *testing.T) {
	r := newRig(t, rigOptions{})
	setClusters(t, r.up, "v1", "c1")
	conn := dialSocket(t, r.socket)
	var clients []*sotwClient
	for range 3 {
		c := newSotwClient(t, conn)
		c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
		clients = append(clients, c)
	}
	for _, c := range clients {
		c.untilVersion(resource.ClusterType, "v1", 5*time.Second)
	}
	if n := r.up.Streams(); n.Active != 3 {
		t.Fatalf("upstream streams %+v, want 3 active", n)
	}
	clients[0].close()
	if !r.up.WaitStreams(5*time.Second, func(n xdsserver.Counts) bool { return n.Active == 2 }) {
		t.Fatal("closing one client did not close exactly its upstream stream")
	}
	setClusters(t, r.up, "v2", "c1", "c2")
	for _, c := range clients[1:] {
		c.untilVersion(resource.ClusterType, "v2", 5*time.Second)
	}
}

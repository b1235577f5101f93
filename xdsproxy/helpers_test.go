package xdsproxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/xdsserver"
)

const (
	testToken     = "token-for-istiod"
	testClusterID = "Kubernetes"
	testSAN       = "istiod.istio-system.svc"
	testNodeID    = "sidecar~10.0.0.1~app-1.default~default.svc.cluster.local"
	testMaxMsg    = 512 << 20
)

// countingFetcher counts how often the proxy asked for the token.
type countingFetcher struct {
	inner credfetcher.Fetcher
	calls atomic.Int64
}

func (c *countingFetcher) Token(ctx context.Context) (string, error) {
	c.calls.Add(1)
	return c.inner.Token(ctx)
}

// tokenFile writes the token where the agent would read it.
func tokenFile(t testing.TB) *countingFetcher {
	t.Helper()
	path := filepath.Join(t.TempDir(), "istio-token")
	if err := os.WriteFile(path, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &countingFetcher{inner: credfetcher.File{Path: path}}
}

func newCA(t testing.TB) *localca.CA {
	t.Helper()
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// rig is a control plane, a running proxy in front of it and what the tests
// look at.
type rig struct {
	t      testing.TB
	ca     *localca.CA
	up     *xdsserver.Server
	proxy  *Proxy
	reg    *prometheus.Registry
	tokens *countingFetcher
	socket string
}

type rigOptions struct {
	// upstreamCA serves the control plane's certificate; default the rig's CA.
	upstreamCA *localca.CA
	// withClientCert gives the proxy a workload certificate from the CA.
	withClientCert bool
	// requireClientCA makes the control plane ask for a client certificate.
	requireClientCA bool
	// opaqueTypes are served by the control plane from caches of their own.
	opaqueTypes []string
	// tweak edits the proxy config before New.
	tweak func(*Config)
}

func newRig(t testing.TB, o rigOptions) *rig {
	t.Helper()
	ca := newCA(t)
	upCA := o.upstreamCA
	if upCA == nil {
		upCA = ca
	}
	scfg := xdsserver.Config{CA: upCA, Tokens: []string{testToken}, ServerNames: []string{testSAN}, OpaqueTypes: o.opaqueTypes}
	if o.requireClientCA {
		scfg.ClientCAs = ca.Pool()
	}
	up := xdsserver.Start(t, scfg)
	r := &rig{t: t, ca: ca, up: up, reg: prometheus.NewRegistry(), tokens: tokenFile(t)}
	cfg := Config{
		SocketPath: filepath.Join(t.TempDir(), "etc", "istio", "proxy", "XDS"),
		Upstream: controlplane.Config{
			Addr:       up.Addr(),
			ServerName: testSAN,
			Roots:      controlplane.StaticRoots{Pool: ca.Pool()},
			Token:      r.tokens,
			Metadata:   map[string]string{"ClusterID": testClusterID, "X-Mesh-Header": "from-env"},
		},
		MaxMessageSize: testMaxMsg,
		InitialBackoff: 5 * time.Millisecond,
		MaxBackoff:     50 * time.Millisecond,
		Registerer:     r.reg,
		Logger:         zaptest.NewLogger(t),
	}
	if o.withClientCert {
		cert := workloadCert(t, ca)
		cfg.Upstream.ClientCertificate = func() (*tls.Certificate, error) { return cert, nil }
	}
	if o.tweak != nil {
		o.tweak(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.proxy, r.socket = p, cfg.SocketPath
	runProxy(t, p)
	return r
}

// runProxy runs p until the test ends and checks it stopped cleanly.
func runProxy(t testing.TB, p *Proxy) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	testwait.For(t, "the proxy socket", func() bool {
		c, err := net.Dial("unix", p.SocketPath())
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	})
}

func (r *rig) counter(name string, labels ...string) float64 {
	r.t.Helper()
	var c prometheus.Collector
	m := r.proxy.metrics
	switch name {
	case "connects":
		c = m.connects
	case "reconnects":
		c = m.reconnects
	case "failures":
		c = m.failures.WithLabelValues(labels...)
	case "messages":
		c = m.messages.WithLabelValues(labels...)
	case "bytes":
		c = m.bytes.WithLabelValues(labels...)
	case "streams":
		c = m.streams.WithLabelValues(labels...)
	case "rejected":
		c = m.rejectedRequests
	default:
		r.t.Fatalf("unknown metric %s", name)
	}
	return testutil.ToFloat64(c)
}

// totalFailures sums the failure counter over every code.
func (r *rig) totalFailures() float64 {
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == "meshagent_xdsproxy_upstream_failures_total" {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// dialSocket connects a plain ADS client to the proxy's socket, as Envoy does.
func dialSocket(t testing.TB, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(testMaxMsg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// sotwClient is an ADS client that reads responses in the background.
type sotwClient struct {
	t      testing.TB
	stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	cancel context.CancelFunc
	resps  chan *discovery.DiscoveryResponse
	mu     sync.Mutex
	err    error
	sent   []*discovery.DiscoveryRequest
	done   chan struct{}
}

func newSotwClient(t testing.TB, conn *grpc.ClientConn) *sotwClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &sotwClient{t: t, stream: st, cancel: cancel, resps: make(chan *discovery.DiscoveryResponse, 64), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			resp, err := st.Recv()
			if err != nil {
				c.mu.Lock()
				c.err = err
				c.mu.Unlock()
				close(c.resps)
				return
			}
			c.resps <- resp
		}
	}()
	t.Cleanup(c.close)
	return c
}

func (c *sotwClient) close() {
	c.cancel()
	<-c.done
}

func (c *sotwClient) streamErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *sotwClient) send(req *discovery.DiscoveryRequest) {
	c.t.Helper()
	if err := c.stream.Send(req); err != nil {
		c.t.Fatalf("send: %v", err)
	}
	c.sent = append(c.sent, req)
}

// next returns the next response or fails the test.
func (c *sotwClient) next(timeout time.Duration) *discovery.DiscoveryResponse {
	c.t.Helper()
	select {
	case resp, ok := <-c.resps:
		if !ok {
			c.t.Fatalf("stream ended: %v", c.streamErr())
		}
		return resp
	case <-time.After(timeout):
		c.t.Fatalf("no response within %v", timeout)
		return nil
	}
}

// ack answers resp as Envoy does after applying it.
func (c *sotwClient) ack(resp *discovery.DiscoveryResponse, names []string) {
	c.t.Helper()
	c.send(&discovery.DiscoveryRequest{
		TypeUrl:       resp.TypeUrl,
		VersionInfo:   resp.VersionInfo,
		ResponseNonce: resp.Nonce,
		ResourceNames: names,
	})
}

// untilVersion reads and ACKs responses until one of typeURL carries version.
func (c *sotwClient) untilVersion(typeURL, version string, timeout time.Duration) *discovery.DiscoveryResponse {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		resp := c.next(time.Until(deadline))
		c.ack(resp, nil)
		if resp.TypeUrl == typeURL && resp.VersionInfo == version {
			return resp
		}
	}
}

func testNode() *core.Node {
	return &core.Node{Id: testNodeID, Cluster: "app-1.default", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"CLUSTER_ID": structpb.NewStringValue(testClusterID),
	}}}
}

func makeCluster(name string) *cluster.Cluster {
	return &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		ConnectTimeout:       nil,
	}
}

func makeListener(name string) *listener.Listener {
	return &listener.Listener{Name: name}
}

// bigClusters returns clusters whose metadata carries payloads adding up to
// about total bytes.
func bigClusters(total, each int) []types.Resource {
	var out []types.Resource
	for i := 0; total > 0; i++ {
		n := min(each, total)
		total -= n
		payload := strings.Repeat(string(rune('a'+i%26)), n)
		out = append(out, &cluster.Cluster{
			Name: fmt.Sprintf("outbound|80||big-%04d.default.svc.cluster.local", i),
			Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
				"istio": {Fields: map[string]*structpb.Value{"payload": structpb.NewStringValue(payload)}},
			}},
		})
	}
	return out
}

func setClusters(t testing.TB, up *xdsserver.Server, version string, clusters ...string) {
	t.Helper()
	var res []types.Resource
	for _, n := range clusters {
		res = append(res, makeCluster(n))
	}
	if err := up.SetResources(testNodeID, version, map[resource.Type][]types.Resource{
		resource.ClusterType:  res,
		resource.ListenerType: {makeListener("virtualInbound")},
	}); err != nil {
		t.Fatal(err)
	}
}

// workloadCert issues a workload certificate from ca.
func workloadCert(t testing.TB, ca *localca.CA) *tls.Certificate {
	t.Helper()
	c, err := ca.TLSCertificate(localca.Leaf{Identity: pki.SPIFFEIdentity("cluster.local", "default", "app-1")})
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

func itoa(i int) string { return strconv.Itoa(i) }

func wrapU32(n uint32) *wrapperspb.UInt32Value { return wrapperspb.UInt32(n) }

package xdsproxy

import (
	"context"
	"fmt"
	"net"
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
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/xdsserver"
)

// tcpCounter dials the control plane for the proxy and counts the TCP
// connections it made and those still open.
type tcpCounter struct {
	dials, open atomic.Int64
}

func (c *tcpCounter) dialOption() grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		c.dials.Add(1)
		c.open.Add(1)
		return &countedConn{Conn: conn, c: c}, nil
	})
}

type countedConn struct {
	net.Conn
	c    *tcpCounter
	once sync.Once
}

func (cc *countedConn) Close() error {
	cc.once.Do(func() { cc.c.open.Add(-1) })
	return cc.Conn.Close()
}

func TestStreamsShareOneUpstreamConnection(t *testing.T) {
	var tcp tcpCounter
	r := newRig(t, rigOptions{tweak: func(cfg *Config) {
		cfg.Upstream.DialOptions = append(cfg.Upstream.DialOptions, tcp.dialOption())
	}})
	// The connection is made when the proxy starts, before any client.
	testwait.For(t, "the upstream connection at start", func() bool { return tcp.dials.Load() == 1 })

	setClusters(t, r.up, "v0", "c0")
	first, second := dialSocket(t, r.socket), dialSocket(t, r.socket)
	clients := []*sotwClient{newSotwClient(t, first), newSotwClient(t, first), newSotwClient(t, second)}
	for _, c := range clients {
		c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	}
	for _, c := range clients {
		c.untilVersion(resource.ClusterType, "v0", 5*time.Second)
	}
	if n := r.up.Streams(); n.Active != 3 {
		t.Fatalf("upstream streams %+v, want 3 active", n)
	}
	if d, o := tcp.dials.Load(), tcp.open.Load(); d != 1 || o != 1 {
		t.Fatalf("%d upstream connections made, %d open; want 1 and 1", d, o)
	}

	// After each restart every stream comes back, on one new connection.
	for i := 1; i <= 3; i++ {
		before := tcp.dials.Load()
		r.up.Restart(t)
		version := "v" + itoa(i)
		setClusters(t, r.up, version, "c0", "c"+itoa(i))
		for _, c := range clients {
			c.untilVersion(resource.ClusterType, version, 5*time.Second)
		}
		if !r.up.WaitStreams(5*time.Second, func(n xdsserver.Counts) bool { return n.Active == 3 }) {
			t.Fatalf("restart %d: upstream streams %+v, want 3 active", i, r.up.Streams())
		}
		testwait.For(t, "one open upstream connection", func() bool { return tcp.open.Load() == 1 })
		if tcp.dials.Load() == before {
			t.Fatalf("restart %d: the proxy did not connect again", i)
		}
	}
	for i, c := range clients {
		if err := c.streamErr(); err != nil {
			t.Fatalf("client %d: downstream stream broke: %v", i, err)
		}
	}
}

// bigListeners returns listeners whose metadata carries payloads adding up
// to about total bytes.
func bigListeners(total, each int) []types.Resource {
	var out []types.Resource
	for i := 0; total > 0; i++ {
		n := min(each, total)
		total -= n
		out = append(out, &listener.Listener{
			Name: fmt.Sprintf("big-listener-%04d", i),
			Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
				"istio": {Fields: map[string]*structpb.Value{"payload": structpb.NewStringValue(strings.Repeat("l", n))}},
			}},
		})
	}
	return out
}

func TestStalledClientDoesNotHoldUpOthersOnTheSharedConnection(t *testing.T) {
	var tcp tcpCounter
	r := newRig(t, rigOptions{tweak: func(cfg *Config) {
		cfg.Upstream.DialOptions = append(cfg.Upstream.DialOptions, tcp.dialOption())
	}})
	const size = 4 << 20
	stalledNode := &core.Node{Id: "sidecar~10.0.0.2~stalled.default~default.svc.cluster.local"}
	if err := r.up.SetResources(stalledNode.Id, "big", map[resource.Type][]types.Resource{
		resource.ClusterType:  bigClusters(size, 1<<20),
		resource.ListenerType: bigListeners(size, 1<<20),
	}); err != nil {
		t.Fatal(err)
	}
	setClusters(t, r.up, "v1", "c1")

	// The stalled client takes two large responses and reads neither. Its
	// flow-control windows are fixed and small, so the proxy can hand the
	// first response to gRPC but blocks sending the second, and with it
	// stops reading that client's upstream stream.
	stalledConn, err := grpc.NewClient("unix://"+r.socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10),
		grpc.WithInitialConnWindowSize(64<<10),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(testMaxMsg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stalledConn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stalled, err := discovery.NewAggregatedDiscoveryServiceClient(stalledConn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, typeURL := range []string{resource.ClusterType, resource.ListenerType} {
		if err := stalled.Send(&discovery.DiscoveryRequest{Node: stalledNode, TypeUrl: typeURL}); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, "the first large response handed to the stalled client", func() bool {
		return r.counter("messages", toDownstream) >= 1
	})

	// Another client, on the same upstream connection, is served meanwhile.
	c := newSotwClient(t, dialSocket(t, r.socket))
	c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	c.untilVersion(resource.ClusterType, "v1", 5*time.Second)
	setClusters(t, r.up, "v2", "c1", "c2")
	if resp := c.untilVersion(resource.ClusterType, "v2", 5*time.Second); len(resp.Resources) != 2 {
		t.Fatalf("v2 has %d clusters, want 2", len(resp.Resources))
	}
	if sent := r.counter("messages", toDownstream); sent >= 4 {
		// 2 to the other client (the LDS response for its node is not asked
		// for), at most 1 to the stalled one.
		t.Fatalf("%v responses sent downstream: the stalled client was not stalled", sent)
	}

	// The stalled client catches up and gets both responses whole.
	got := map[string]int{}
	for range 2 {
		resp, err := stalled.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range resp.Resources {
			var payload string
			switch resp.TypeUrl {
			case resource.ClusterType:
				var cl cluster.Cluster
				if err := a.UnmarshalTo(&cl); err != nil {
					t.Fatal(err)
				}
				payload = cl.GetMetadata().GetFilterMetadata()["istio"].GetFields()["payload"].GetStringValue()
			case resource.ListenerType:
				var l listener.Listener
				if err := a.UnmarshalTo(&l); err != nil {
					t.Fatal(err)
				}
				payload = l.GetMetadata().GetFilterMetadata()["istio"].GetFields()["payload"].GetStringValue()
			}
			got[resp.TypeUrl] += len(payload)
		}
		t.Logf("stalled client: %s response of %d bytes", resp.TypeUrl, proto.Size(resp))
	}
	if got[resource.ClusterType] != size || got[resource.ListenerType] != size {
		t.Fatalf("stalled client got payloads %v, want %d bytes of each type", got, size)
	}
	if d := tcp.dials.Load(); d != 1 {
		t.Fatalf("%d upstream connections, want 1", d)
	}
}

// With ConnectAfter the connection made at start waits for it, but a client
// stream opened before it connects at once.
func TestConnectAfterHoldsBackTheStartConnection(t *testing.T) {
	var held, eager tcpCounter
	after := make(chan struct{})
	newRig(t, rigOptions{tweak: func(cfg *Config) {
		cfg.Upstream.DialOptions = append(cfg.Upstream.DialOptions, held.dialOption())
		cfg.ConnectAfter = after
	}})
	// The socket is served (newRig waited for it). A proxy without
	// ConnectAfter, started after this one, connecting shows the time for
	// a connection at start has passed.
	newRig(t, rigOptions{tweak: func(cfg *Config) {
		cfg.Upstream.DialOptions = append(cfg.Upstream.DialOptions, eager.dialOption())
	}})
	testwait.For(t, "the proxy without ConnectAfter to connect at start", func() bool { return eager.dials.Load() == 1 })
	if n := held.dials.Load(); n != 0 {
		t.Fatalf("%d upstream connections before ConnectAfter closed, want 0", n)
	}
	close(after)
	testwait.For(t, "the upstream connection once ConnectAfter closed", func() bool { return held.dials.Load() == 1 })

	// Another proxy whose ConnectAfter never closes still serves a client.
	var tcp2 tcpCounter
	r2 := newRig(t, rigOptions{tweak: func(cfg *Config) {
		cfg.Upstream.DialOptions = append(cfg.Upstream.DialOptions, tcp2.dialOption())
		cfg.ConnectAfter = make(chan struct{})
	}})
	setClusters(t, r2.up, "v0", "c0")
	c := newSotwClient(t, dialSocket(t, r2.socket))
	c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	c.untilVersion(resource.ClusterType, "v0", 5*time.Second)
	if n := tcp2.dials.Load(); n != 1 {
		t.Fatalf("%d upstream connections for the client's stream, want 1", n)
	}
}

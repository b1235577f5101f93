package xdsproxy

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/testwait"
)

// stuckUpstream is a control plane that pushes responses but never reads a
// request, with flow-control windows small enough that the proxy's requests
// back up at once.
func stuckUpstream(t *testing.T, responses, size int) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.InitialWindowSize(64<<10),
		grpc.InitialConnWindowSize(64<<10),
	)
	body := mustMarshal(t, &discovery.DiscoveryResponse{
		TypeUrl:   resource.ClusterType,
		Resources: []*anypb.Any{{TypeUrl: resource.ClusterType, Value: make([]byte, size)}},
	})
	handler := func(_ any, ss grpc.ServerStream) error {
		for i := range responses {
			nonce := mustMarshal(t, &discovery.DiscoveryResponse{Nonce: itoa(i)})
			// Concatenated messages merge: the nonce field is appended.
			if err := ss.SendMsg(bytesFrame(append(append([]byte(nil), body...), nonce...))); err != nil {
				return err
			}
		}
		<-ss.Context().Done()
		return nil
	}
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: discovery.AggregatedDiscoveryService_ServiceDesc.ServiceName,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName: sotwProtocol.desc.StreamName, Handler: handler, ServerStreams: true, ClientStreams: true,
		}},
	}, nil)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func TestStuckUpstreamDoesNotStallResponses(t *testing.T) {
	const responses, size = 40, 200 << 10
	addr := stuckUpstream(t, responses, size)
	p, err := New(Config{
		SocketPath:     filepath.Join(t.TempDir(), "XDS"),
		Upstream:       controlplane.Config{Addr: addr, Plaintext: true},
		MaxMessageSize: 1 << 20,
		InitialBackoff: time.Millisecond,
		MaxBackoff:     10 * time.Millisecond,
		Logger:         zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	runProxy(t, p)
	c := newSotwClient(t, dialSocket(t, p.SocketPath()))
	c.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	// Requests pile up far beyond what the control plane will take: 4 MiB
	// of them against a 1 MiB queue and 64 KiB windows.
	name := strings.Repeat("n", 8<<10)
	for range 512 {
		c.send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNames: []string{name}})
	}
	// Responses keep coming all the while.
	for range responses {
		if resp := c.next(10 * time.Second); len(resp.Resources) != 1 {
			t.Fatalf("response with %d resources", len(resp.Resources))
		}
	}
	testwait.For(t, "the backlogged stream to be replaced", func() bool {
		return testutil.ToFloat64(p.metrics.failures.WithLabelValues(codes.ResourceExhausted.String())) >= 1
	})
	if err := c.streamErr(); err != nil {
		t.Fatalf("downstream stream ended: %v", err)
	}
}

package trustroots

import (
	"context"
	"os"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/xdsserver"
)

// openADS opens an ADS stream on the agent's xDS proxy socket and asks for
// clusters, as Envoy would; the proxy keeps it open across upstream
// reconnections and asks again on each new upstream stream.
func openADS(t *testing.T, socket string) {
	t.Helper()
	testwait.Within(t, 30*time.Second, "the xDS proxy socket", func() bool {
		_, err := os.Stat(socket)
		return err == nil
	})
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		_ = conn.Close()
	})
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discovery.DiscoveryRequest{Node: &corev3.Node{Id: "sidecar~127.0.0.1~web-0.app~app.svc.cluster.local"}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
}

// waitUpstream waits until xs has seen at least n ADS streams: the xDS
// proxy connected to it, its TLS certificate verified with the agent's
// roots.
func waitUpstream(t *testing.T, xs *xdsserver.Server, n int, what string) {
	t.Helper()
	if !xs.WaitStreams(30*time.Second, func(c xdsserver.Counts) bool { return c.Opened >= n }) {
		t.Fatalf("the xDS proxy did not reach the control plane %s", what)
	}
}

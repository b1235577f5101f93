package xdsserver_test

import (
	"context"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/xdsserver"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const node = "node-1"

type staticToken string

func (s staticToken) Token(context.Context) (string, error) { return string(s), nil }

func dial(t *testing.T, s *xdsserver.Server, ca *localca.CA, token string) *grpc.ClientConn {
	t.Helper()
	cfg := controlplane.Config{Addr: s.Addr(), ServerName: "xds.test", Metadata: map[string]string{"ClusterID": "c1"}}
	if ca != nil {
		cfg.Roots = controlplane.StaticRoots{Pool: ca.Pool()}
	} else {
		cfg.Plaintext = true
	}
	if token != "" {
		cfg.Token = staticToken(token)
	}
	conn, err := controlplane.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func fetch(t *testing.T, conn *grpc.ClientConn) (*discovery.DiscoveryResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	// A stream the server already ended fails Send with io.EOF; Recv says why.
	_ = st.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: resource.ClusterType})
	return st.Recv()
}

func setVersion(t *testing.T, s *xdsserver.Server, version string) {
	t.Helper()
	err := s.SetResources(node, version, map[resource.Type][]types.Resource{
		resource.ClusterType: {&cluster.Cluster{Name: "c-" + version}},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestTokenCheckAndRecords(t *testing.T) {
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := xdsserver.Start(t, xdsserver.Config{CA: ca, Tokens: []string{"good"}, ServerNames: []string{"xds.test"}})
	setVersion(t, s, "v1")

	if _, err := fetch(t, dial(t, s, ca, "bad")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("wrong token: %v", err)
	}
	resp, err := fetch(t, dial(t, s, ca, "good"))
	if err != nil || resp.VersionInfo != "v1" {
		t.Fatalf("good token: %v %v", resp, err)
	}
	if !s.WaitStreams(5*time.Second, func(c xdsserver.Counts) bool { return c.Active == 0 }) {
		t.Fatal("streams still active")
	}
	if c := s.Streams(); c.Opened != 2 || c.Rejected != 1 {
		t.Errorf("counts %+v", c)
	}
	md := s.LastMetadata()
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer good" {
		t.Errorf("authorization %q", got)
	}
	if got := md.Get("clusterid"); len(got) != 1 || got[0] != "c1" {
		t.Errorf("ClusterID %q", got)
	}
	calls := s.Calls()
	if len(calls) != 2 || len(calls[1].Requests) != 1 || calls[1].Requests[0].GetNode().GetId() != node {
		t.Fatalf("calls %+v", calls)
	}
	if calls[0].Err == nil || !calls[1].Done {
		t.Errorf("call outcomes: %v %v", calls[0].Err, calls[1].Done)
	}
}

func TestRestartKeepsAddressAndSnapshots(t *testing.T) {
	s := xdsserver.Start(t, xdsserver.Config{Plaintext: true})
	setVersion(t, s, "v1")
	conn := dial(t, s, nil, "")
	addr := s.Addr()
	for i := range 3 {
		s.Restart(t)
		if s.Addr() != addr {
			t.Fatalf("restart %d moved to %s", i, s.Addr())
		}
		var resp *discovery.DiscoveryResponse
		var err error
		// The client's connection broke; gRPC reconnects on the next call.
		testwait.Within(t, 5*time.Second, "a fetch after the restart", func() bool {
			resp, err = fetch(t, conn)
			return err == nil
		})
		if err != nil || resp.VersionInfo != "v1" {
			t.Fatalf("after restart %d: %v %v", i, resp, err)
		}
	}
	s.Stop()
	s.Stop()
	if _, err := fetch(t, dial(t, s, nil, "")); err == nil {
		t.Fatal("a stopped server answered")
	}
	var md metadata.MD = s.LastMetadata()
	if md == nil {
		t.Error("no metadata recorded")
	}
}

// An opaque type is served whatever its messages are: here istiod's
// ProxyConfig, on the same ADS stream as clusters.
func TestOpaqueType(t *testing.T) {
	const pcType = "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"
	s := xdsserver.Start(t, xdsserver.Config{Plaintext: true, OpaqueTypes: []string{pcType}})
	if err := s.SetOpaque(resource.ClusterType, nil); err == nil {
		t.Error("SetOpaque accepted a type that is not opaque")
	}
	if err := s.SetOpaque(pcType, map[string]proto.Message{"mesh": &meshconfig.ProxyConfig{CaCertificatesPem: []string{"root"}}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(dial(t, s, nil, "")).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: pcType}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.TypeUrl != pcType || len(resp.Resources) != 1 {
		t.Fatalf("response %v, want one ProxyConfig", resp)
	}
	pc := &meshconfig.ProxyConfig{}
	if err := resp.Resources[0].UnmarshalTo(pc); err != nil || pc.GetCaCertificatesPem()[0] != "root" {
		t.Fatalf("ProxyConfig %v (%v), want the root published", pc, err)
	}
}

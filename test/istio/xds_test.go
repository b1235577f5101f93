package istio

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/istiod"
)

const echoPort = 7070

// echoService is a Service "echo" in ns whose one endpoint is a real gRPC
// server (the health service) on a loopback port. The API server refuses
// loopback addresses in EndpointSlices, so the endpoint is a WorkloadEntry
// at 127.0.0.1 that the Service selects, as a VM's would be. It returns the
// Service's host name and the server's address.
func echoService(t *testing.T, w *workload) (host, addr string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	port := lis.Addr().(*net.TCPAddr).Port

	ctx := context.Background()
	if _, err := w.env.Client().CoreV1().Services(w.ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "echo"},
			Ports: []corev1.ServicePort{{
				Name: "grpc", Port: echoPort, TargetPort: intstr.FromInt32(int32(port)),
				AppProtocol: ptr("grpc"),
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(w.env.Config())
	if err != nil {
		t.Fatal(err)
	}
	we := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1",
		"kind":       "WorkloadEntry",
		"metadata":   map[string]any{"name": "echo-0", "namespace": w.ns},
		"spec": map[string]any{
			"address": "127.0.0.1",
			"labels":  map[string]any{"app": "echo"},
		},
	}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "workloadentries"}).
		Namespace(w.ns).Create(ctx, we, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return "echo." + w.ns + ".svc.cluster.local", lis.Addr().String()
}

func ptr[T any](v T) *T { return &v }

// adsClient is an Envoy-shaped ADS client: one state-of-the-world stream on
// the agent's xDS socket, the node as pilot-agent describes Envoy, requests
// in Envoy's order (CDS, EDS, LDS, RDS), every answer ACKed.
type adsClient struct {
	t      *testing.T
	stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node   *corev3.Node
	// versions and nonces of the last answer per type, for the ACKs.
	versions, nonces map[string]string
}

func newADSClient(t *testing.T, socket string, w *workload) *adsClient {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md, err := structpb.NewStruct(map[string]any{
		"NAMESPACE":       w.ns,
		"SERVICE_ACCOUNT": w.sa,
		"CLUSTER_ID":      istiod.ClusterID,
		"ISTIO_VERSION":   "1.31-dev",
		"LABELS":          map[string]any{"app": w.sa},
		"WORKLOAD_NAME":   w.sa,
		"INSTANCE_IPS":    "127.0.0.1",
	})
	if err != nil {
		t.Fatal(err)
	}
	return &adsClient{t: t, stream: stream, node: &corev3.Node{Id: w.nodeID(), Cluster: w.sa + "." + w.ns, Metadata: md},
		versions: map[string]string{}, nonces: map[string]string{}}
}

// get asks for names of typeURL (none: every one) and returns the first
// answer of that type that holds what want accepts, ACKing every answer on
// the way. Answers of other types are ACKed and dropped.
func (c *adsClient) get(typeURL string, names []string, want func([]*anypb.Any) bool) []*anypb.Any {
	c.t.Helper()
	if err := c.stream.Send(&discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: typeURL, ResourceNames: names,
		VersionInfo: c.versions[typeURL], ResponseNonce: c.nonces[typeURL]}); err != nil {
		c.t.Fatalf("ADS request for %s: %v", typeURL, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := c.recv(time.Until(deadline))
		if err != nil {
			c.t.Fatalf("ADS answer for %s %v: %v", typeURL, names, err)
		}
		c.versions[resp.GetTypeUrl()], c.nonces[resp.GetTypeUrl()] = resp.GetVersionInfo(), resp.GetNonce()
		ackNames := names
		if resp.GetTypeUrl() != typeURL {
			ackNames = nil
		}
		if err := c.stream.Send(&discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: resp.GetTypeUrl(), ResourceNames: ackNames,
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			c.t.Fatalf("ADS ACK: %v", err)
		}
		if resp.GetTypeUrl() == typeURL && want(resp.GetResources()) {
			return resp.GetResources()
		}
	}
	c.t.Fatalf("no %s answer with what the test wants %v within 30 s", typeURL, names)
	return nil
}

func (c *adsClient) recv(within time.Duration) (*discoveryv3.DiscoveryResponse, error) {
	type result struct {
		resp *discoveryv3.DiscoveryResponse
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		resp, err := c.stream.Recv()
		ch <- result{resp, err}
	}()
	select {
	case r := <-ch:
		return r.resp, r.err
	case <-time.After(within):
		return nil, fmt.Errorf("no answer within %v", within)
	}
}

// TestEnvoyADSThroughAgentFromIstiod: an Envoy-shaped ADS client on the
// agent's xDS socket gets istiod's Cluster, Endpoints, Listener and Route
// for a Service, through the agent's proxy (TLS to istiod's secure port
// with the pod's token).
func TestEnvoyADSThroughAgentFromIstiod(t *testing.T) {
	w := newWorkload(t, "web", "node-a")
	host, addr := echoService(t, w)
	a := w.startSidecar(t)
	socket := filepath.Join(w.dir, "etc/istio/proxy/XDS")
	testwait.Within(t, 30*time.Second, "the xDS proxy socket", func() bool {
		_, err := os.Stat(socket)
		return err == nil
	})
	c := newADSClient(t, socket, w)
	cluster := "outbound|" + strconv.Itoa(echoPort) + "||" + host

	c.get(resourcev3.ClusterType, nil, func(res []*anypb.Any) bool {
		return slices.Contains(clusterNames(t, res), cluster)
	})
	eds := c.get(resourcev3.EndpointType, []string{cluster}, func(res []*anypb.Any) bool {
		return slices.Contains(endpointAddrs(t, res), addr)
	})
	if got := endpointAddrs(t, eds); !slices.Equal(got, []string{addr}) {
		t.Errorf("endpoints of %s: %v, want [%s]", cluster, got, addr)
	}
	listener := "0.0.0.0_" + strconv.Itoa(echoPort)
	c.get(resourcev3.ListenerType, nil, func(res []*anypb.Any) bool {
		return slices.Contains(listenerNames(t, res), listener)
	})
	route := strconv.Itoa(echoPort)
	c.get(resourcev3.RouteType, []string{route}, func(res []*anypb.Any) bool {
		return routeHasDomain(t, res, host)
	})
	// With the proxy on, ready means istiod has answered too.
	a.waitReady(t, 30*time.Second)
}

// TestProxylessGRPCThroughAgentFromIstiod: grpc-go's own xDS resolver, with
// the bootstrap the agent wrote, resolves the Service through the agent's
// proxy from istiod (Listener, Route, Cluster, Endpoints) and calls it.
func TestProxylessGRPCThroughAgentFromIstiod(t *testing.T) {
	w := newWorkload(t, "client", "node-a")
	host, _ := echoService(t, w)
	bootstrap := filepath.Join(w.dir, "grpc-bootstrap.json")
	a := w.startSidecar(t,
		"DISABLE_ENVOY=true",
		"GRPC_XDS_BOOTSTRAP="+bootstrap,
		"OUTPUT_CERTS="+filepath.Join(w.dir, "certs"))
	a.waitFiles(t, 60*time.Second, proxylessFiles(w.dir)...)
	b, err := os.ReadFile(bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := xds.NewXDSResolverWithConfigForTesting(b)
	if err != nil {
		t.Fatalf("grpc-go rejects the agent's bootstrap: %v\n%s", err, b)
	}
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	target := "xds:///" + host + ":" + strconv.Itoa(echoPort)
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("call to %s through istiod's xDS: %v", target, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v", resp.GetStatus())
	}
	// istiod has answered the client through the proxy: the agent is ready.
	a.waitReady(t, 10*time.Second)
}

func clusterNames(t *testing.T, res []*anypb.Any) []string {
	var out []string
	for _, a := range res {
		var c clusterv3.Cluster
		if err := a.UnmarshalTo(&c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c.GetName())
	}
	return out
}

func listenerNames(t *testing.T, res []*anypb.Any) []string {
	var out []string
	for _, a := range res {
		var l listenerv3.Listener
		if err := a.UnmarshalTo(&l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l.GetName())
	}
	return out
}

func endpointAddrs(t *testing.T, res []*anypb.Any) []string {
	var out []string
	for _, a := range res {
		var cla endpointv3.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			t.Fatal(err)
		}
		for _, le := range cla.GetEndpoints() {
			for _, e := range le.GetLbEndpoints() {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				out = append(out, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
			}
		}
	}
	return out
}

func routeHasDomain(t *testing.T, res []*anypb.Any, host string) bool {
	for _, a := range res {
		var rc routev3.RouteConfiguration
		if err := a.UnmarshalTo(&rc); err != nil {
			t.Fatal(err)
		}
		for _, vh := range rc.GetVirtualHosts() {
			for _, d := range vh.GetDomains() {
				if strings.HasPrefix(d, host) {
					return true
				}
			}
		}
	}
	return false
}

package test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacconfigv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/heavy"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/xdsserver"
)

// The proxyless scenario: three agents (the real binary) in DISABLE_ENVOY
// mode write gRPC bootstraps and OUTPUT_CERTS; a grpc-go xDS server and xDS
// clients in this process read them, fetch their resources through the
// agents' xDS proxies from a go-control-plane server, and talk mTLS with the
// agents' certificates under an RBAC policy.

const (
	pxNamespace  = "default"
	pxTargetHost = "echo.test"
	pxRoute      = "echo-route"
	pxCluster    = "echo-cluster"
	pxEDS        = "echo-eds"
	pxHealthPath = "/grpc.health.v1.Health/Check"
	pxSecretTTL  = 10 * time.Second
)

// pxAgentBinary builds cmd/agent into a temporary directory, unless
// MESHAGENT_TEST_AGENT_BIN names an agent binary already built.
func pxAgentBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("MESHAGENT_TEST_AGENT_BIN"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	heavy.Skip(t, "builds and runs the agent")
	bin := filepath.Join(t.TempDir(), "meshagent")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/meshagent/meshagent/cmd/agent").CombinedOutput()
	if err != nil {
		t.Fatalf("building the agent: %v: %s", err, out)
	}
	return bin
}

// pxAgent is one agent process with its own working directory.
type pxAgent struct {
	name string
	// nodeID is the node ID the agent must present to the control plane,
	// built from the agent's inputs (INSTANCE_IP, POD_NAME, POD_NAMESPACE).
	nodeID    string
	dir       string
	certs     string
	bootstrap string
	log       *bytes.Buffer
	logMu     *sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (a *pxAgent) logs() string {
	a.logMu.Lock()
	defer a.logMu.Unlock()
	return a.log.String()
}

// startPxAgent runs the agent binary for service account sa, with
// INSTANCE_IP instanceIP.
func startPxAgent(t *testing.T, bin string, ca *istioca.Server, xs *xdsserver.Server, rootPath, sa, instanceIP string) *pxAgent {
	t.Helper()
	// Short, so the xDS socket path fits a Unix socket address.
	dir, err := os.MkdirTemp("", "px")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	token := "token-" + sa
	ca.AddToken(token, istioca.ServiceAccount{Namespace: pxNamespace, Name: sa})
	tokenPath := filepath.Join(dir, "istio-token")
	if err := os.WriteFile(tokenPath, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	pod := sa + "-pod"
	a := &pxAgent{
		name:      sa,
		nodeID:    "sidecar~" + instanceIP + "~" + pod + "." + pxNamespace + "~" + pxNamespace + ".svc.cluster.local",
		dir:       dir,
		certs:     filepath.Join(dir, "certs"),
		bootstrap: filepath.Join(dir, "grpc-bootstrap.json"),
		log:       &bytes.Buffer{},
		logMu:     &sync.Mutex{},
		done:      make(chan struct{}),
	}
	proxyConfig, _ := json.Marshal(map[string]any{"discoveryAddress": xs.Addr()})
	a.cmd = exec.Command(bin, "run")
	a.cmd.Dir = dir
	a.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"DISABLE_ENVOY=true",
		"OUTPUT_CERTS=" + a.certs,
		"GRPC_XDS_BOOTSTRAP=" + a.bootstrap,
		"CA_ADDR=" + ca.Addr(),
		"CA_ROOT_CA=" + rootPath,
		"XDS_ROOT_CA=" + rootPath,
		"ISTIOD_SAN=" + istioca.DefaultServerName,
		"PROXY_CONFIG=" + string(proxyConfig),
		"SECRET_TTL=" + pxSecretTTL.String(),
		"POD_NAME=" + pod,
		"INSTANCE_IP=" + instanceIP,
		"POD_NAMESPACE=" + pxNamespace,
		"SERVICE_ACCOUNT=" + sa,
		"MESHAGENT_TOKEN_PATH=" + tokenPath,
		"STATUS_PORT=0",
		"MESHAGENT_STATUS_HOST=127.0.0.1",
		"MESHAGENT_LOG_LEVEL=debug",
	}
	w := lockedWriter{mu: a.logMu, b: a.log}
	a.cmd.Stdout, a.cmd.Stderr = w, w
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = a.cmd.Wait()
		close(a.done)
	}()
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.done:
		case <-time.After(5 * time.Second):
			_ = a.cmd.Process.Kill()
			<-a.done
		}
		if t.Failed() {
			l := a.logs()
			t.Logf("agent %s logs (tail):\n%s", a.name, l[max(0, len(l)-6000):])
		}
	})
	return a
}

// waitReady waits for the bootstrap and the certificate files.
func (a *pxAgent) waitReady(t *testing.T) {
	t.Helper()
	testwait.Within(t, 15*time.Second, "agent "+a.name+" wrote its bootstrap and certificates", func() bool {
		select {
		case <-a.done:
			t.Fatalf("agent %s exited: %s", a.name, a.logs())
		default:
		}
		for _, p := range []string{a.bootstrap, filepath.Join(a.certs, files.CertChainFile), filepath.Join(a.certs, files.KeyFile), filepath.Join(a.certs, files.RootCertFile)} {
			if _, err := os.Stat(p); err != nil {
				return false
			}
		}
		return true
	})
}

func (a *pxAgent) bootstrapJSON(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(a.bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pxReceivedNodeIDs maps each bearer token to the node IDs the control
// plane received on streams carrying it.
func pxReceivedNodeIDs(xs *xdsserver.Server) map[string][]string {
	out := map[string][]string{}
	for _, c := range xs.Calls() {
		for _, auth := range c.Metadata.Get("authorization") {
			for _, r := range c.Requests {
				if id := r.GetNode().GetId(); id != "" && !slices.Contains(out[auth], id) {
					out[auth] = append(out[auth], id)
				}
			}
			for _, r := range c.DeltaRequests {
				if id := r.GetNode().GetId(); id != "" && !slices.Contains(out[auth], id) {
					out[auth] = append(out[auth], id)
				}
			}
		}
	}
	return out
}

// leaf is the current leaf certificate in OUTPUT_CERTS (nil while the file
// is absent or being replaced).
func (a *pxAgent) leaf() *x509.Certificate {
	b, err := os.ReadFile(filepath.Join(a.certs, files.CertChainFile))
	if err != nil {
		return nil
	}
	chain, err := pki.ParseCertificates(b)
	if err != nil || len(chain) == 0 {
		return nil
	}
	return chain[0]
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func adsSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
}

// pxProviderTLS is a CommonTlsContext taking the identity and the roots from
// the bootstrap's certificate provider instance.
func pxProviderTLS(peerSAN string) *tlsv3.CommonTlsContext {
	validation := &tlsv3.CertificateValidationContext{
		CaCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: "default", CertificateName: "ROOTCA"},
	}
	if peerSAN != "" {
		validation.MatchSubjectAltNames = []*matcherv3.StringMatcher{{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: peerSAN}}}
	}
	return &tlsv3.CommonTlsContext{
		TlsCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: "default", CertificateName: "default"},
		ValidationContextType:          &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: validation},
	}
}

// pxResources is the control plane's configuration: the server's inbound
// listener with RBAC, and the client's listener, route, cluster and
// endpoints.
func pxResources(t *testing.T, serverPort int, serverID, allowedClient string) map[resource.Type][]types.Resource {
	t.Helper()
	router := &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &routerv3.Router{})}}
	rbac := &rbacv3.RBAC{Rules: &rbacconfigv3.RBAC{
		Action: rbacconfigv3.RBAC_ALLOW,
		Policies: map[string]*rbacconfigv3.Policy{
			"health-open": {
				Permissions: []*rbacconfigv3.Permission{{Rule: &rbacconfigv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{
					Rule: &matcherv3.PathMatcher_Path{Path: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: pxHealthPath}}},
				}}}},
				Principals: []*rbacconfigv3.Principal{{Identifier: &rbacconfigv3.Principal_Any{Any: true}}},
			},
			"mesh-allow-list": {
				Permissions: []*rbacconfigv3.Permission{{Rule: &rbacconfigv3.Permission_Any{Any: true}}},
				Principals: []*rbacconfigv3.Principal{{Identifier: &rbacconfigv3.Principal_Authenticated_{Authenticated: &rbacconfigv3.Principal_Authenticated{
					PrincipalName: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: allowedClient}},
				}}}},
			},
		},
	}}
	serverHCM := &hcmv3.HttpConnectionManager{
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: "inbound",
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    "inbound",
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_NonForwardingAction{NonForwardingAction: &routev3.NonForwardingAction{}},
				}},
			}},
		}},
		HttpFilters: []*hcmv3.HttpFilter{
			{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, rbac)}},
			router,
		},
	}
	serverListener := &listenerv3.Listener{
		Name: fmt.Sprintf("xds.istio.io/grpc/lds/inbound/127.0.0.1:%d", serverPort),
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address:       "127.0.0.1",
			PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(serverPort)},
		}}},
		FilterChains: []*listenerv3.FilterChain{{
			Name: "inbound-mtls",
			Filters: []*listenerv3.Filter{{
				Name:       "envoy.filters.network.http_connection_manager",
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, serverHCM)},
			}},
			TransportSocket: &corev3.TransportSocket{
				Name: "envoy.transport_sockets.tls",
				ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(t, &tlsv3.DownstreamTlsContext{
					CommonTlsContext:         pxProviderTLS(""),
					RequireClientCertificate: wrapperspb.Bool(true),
				})},
			},
		}},
	}

	clientHCM := &hcmv3.HttpConnectionManager{
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{ConfigSource: adsSource(), RouteConfigName: pxRoute}},
		HttpFilters:    []*hcmv3.HttpFilter{router},
	}
	clientListener := &listenerv3.Listener{
		Name:        pxTargetHost,
		ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(t, clientHCM)},
	}
	route := &routev3.RouteConfiguration{
		Name: pxRoute,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    pxTargetHost,
			Domains: []string{pxTargetHost},
			Routes: []*routev3.Route{{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: pxCluster}}},
			}},
		}},
	}
	cluster := &clusterv3.Cluster{
		Name:                 pxCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsSource(), ServiceName: pxEDS},
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		TransportSocket: &corev3.TransportSocket{
			Name: "envoy.transport_sockets.tls",
			ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(t, &tlsv3.UpstreamTlsContext{
				CommonTlsContext: pxProviderTLS(serverID),
			})},
		},
	}
	endpoints := &endpointv3.ClusterLoadAssignment{
		ClusterName: pxEDS,
		Endpoints: []*endpointv3.LocalityLbEndpoints{{
			Locality:            &corev3.Locality{Region: "local"},
			LoadBalancingWeight: wrapperspb.UInt32(1),
			LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address:       "127.0.0.1",
						PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(serverPort)},
					}}},
				}},
				HealthStatus: corev3.HealthStatus_HEALTHY,
			}},
		}},
	}
	return map[resource.Type][]types.Resource{
		resource.ListenerType: {serverListener, clientListener},
		resource.RouteType:    {route},
		resource.ClusterType:  {cluster},
		resource.EndpointType: {endpoints},
	}
}

type pxTestService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (pxTestService) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

// pxClient is one xDS client connection built from an agent's bootstrap.
func pxClient(t *testing.T, builder resolver.Builder) *grpc.ClientConn {
	t.Helper()
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///"+pxTargetHost, grpc.WithTransportCredentials(creds), grpc.WithResolvers(builder))
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

func pxBuilder(t *testing.T, a *pxAgent) resolver.Builder {
	t.Helper()
	b, err := xds.NewXDSResolverWithConfigForTesting(a.bootstrapJSON(t))
	if err != nil {
		t.Fatalf("grpc-go rejects agent %s's bootstrap: %v", a.name, err)
	}
	return b
}

// pxServerSerial is the serial of the leaf the server presented on the call.
func pxServerSerial(t *testing.T, p *peer.Peer) string {
	t.Helper()
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		t.Fatalf("peer auth info %T, want TLS", p.AuthInfo)
	}
	if len(info.State.PeerCertificates) == 0 {
		t.Fatal("the server presented no certificate")
	}
	return info.State.PeerCertificates[0].SerialNumber.String()
}

// pxMesh is the proxyless scenario's world: a test CA, an xDS server and
// three ready agents (server, client and other: an identity the RBAC policy
// does not allow), with the server's and client's SPIFFE IDs.
type pxMesh struct {
	ca                          *istioca.Server
	xs                          *xdsserver.Server
	serverAgent, clientAgent    *pxAgent
	otherAgent                  *pxAgent
	serverID, clientID, otherID string
}

// newPxMesh starts it; otherIP is the other agent's INSTANCE_IP (it only
// names the workload in its node ID; nothing dials it).
func newPxMesh(t *testing.T, bin, otherIP string) *pxMesh {
	t.Helper()
	ca := istioca.Start(t, istioca.Config{})
	xs := xdsserver.Start(t, xdsserver.Config{CA: ca.CA(), ServerNames: []string{istioca.DefaultServerName}, Tokens: []string{"token-server", "token-client", "token-other"}})
	rootPath := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(rootPath, ca.RootPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	m := &pxMesh{ca: ca, xs: xs,
		serverAgent: startPxAgent(t, bin, ca, xs, rootPath, "server", "10.20.0.1"),
		clientAgent: startPxAgent(t, bin, ca, xs, rootPath, "client", "10.20.0.2"),
		otherAgent:  startPxAgent(t, bin, ca, xs, rootPath, "other", otherIP),
	}
	for _, a := range m.agents() {
		a.waitReady(t)
	}
	id := func(sa string) string {
		return ca.Identity(istioca.ServiceAccount{Namespace: pxNamespace, Name: sa}).String()
	}
	m.serverID, m.clientID, m.otherID = id("server"), id("client"), id("other")
	return m
}

func (m *pxMesh) agents() []*pxAgent { return []*pxAgent{m.serverAgent, m.clientAgent, m.otherAgent} }

func TestProxylessGRPCWithAgentBootstraps(t *testing.T) {
	m := newPxMesh(t, pxAgentBinary(t), "fd00::3")
	xs := m.xs
	serverAgent, clientAgent, otherAgent := m.serverAgent, m.clientAgent, m.otherAgent
	agents := m.agents()
	serverID, clientID := m.serverID, m.clientID

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	res := pxResources(t, port, serverID, clientID)
	// The configuration is keyed by the node ID istiod would parse: an agent
	// presenting any other ID gets nothing.
	for _, a := range agents {
		if err := xs.SetResources(a.nodeID, "1", res); err != nil {
			t.Fatal(err)
		}
	}

	// The xDS server, on the server agent's bootstrap.
	screds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	serving := make(chan error, 8)
	srv, err := xds.NewGRPCServer(
		grpc.Creds(screds),
		xds.BootstrapContentsForTesting(serverAgent.bootstrapJSON(t)),
		xds.ServingModeCallback(func(_ net.Addr, args xds.ServingModeChangeArgs) {
			if args.Mode == connectivity.ServingModeServing {
				serving <- nil
			} else if args.Err != nil {
				serving <- args.Err
			}
		}),
	)
	if err != nil {
		t.Fatalf("grpc-go rejects the server agent's bootstrap: %v", err)
	}
	testgrpc.RegisterTestServiceServer(srv, pxTestService{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	select {
	case err := <-serving:
		if err != nil {
			t.Fatalf("the xDS server did not start serving: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the xDS server got no listener through the agent's xDS proxy (want node ID %q; the control plane received %v)", serverAgent.nodeID, pxReceivedNodeIDs(xs))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	clientBuilder := pxBuilder(t, clientAgent)

	// 1. The allowed client succeeds on the protected route, over mTLS with
	// the server agent's certificate.
	cc := pxClient(t, clientBuilder)
	var p peer.Peer
	fctx, fcancel := context.WithTimeout(ctx, 15*time.Second)
	defer fcancel()
	if _, err := testgrpc.NewTestServiceClient(cc).EmptyCall(fctx, &testgrpc.Empty{}, grpc.Peer(&p), grpc.WaitForReady(true)); err != nil {
		t.Fatalf("allowed client on the protected route: %v", err)
	}
	firstSerial := pxServerSerial(t, &p)
	if leaf := serverAgent.leaf(); leaf == nil || leaf.SerialNumber.String() != firstSerial {
		t.Fatalf("the server presented serial %s, not the server agent's OUTPUT_CERTS leaf", firstSerial)
	}
	info := p.AuthInfo.(credentials.TLSInfo)
	if uris := info.State.PeerCertificates[0].URIs; len(uris) != 1 || uris[0].String() != serverID {
		t.Fatalf("server SAN %v, want %s", uris, serverID)
	}
	_ = cc.Close()

	// 2. A client with another mesh identity: denied on the protected
	// route, allowed on the health route.
	oc := pxClient(t, pxBuilder(t, otherAgent))
	_, err = testgrpc.NewTestServiceClient(oc).EmptyCall(ctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("other identity on the protected route: %v, want PermissionDenied", err)
	}
	hr, err := healthpb.NewHealthClient(oc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("other identity on the health route: %v %v", hr, err)
	}
	_ = oc.Close()

	// 3. A plaintext client is refused.
	pc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = healthpb.NewHealthClient(pc).Check(pctx, &healthpb.HealthCheckRequest{})
	pcancel()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext client: %v, want Unavailable (refused at the handshake)", err)
	}
	_ = pc.Close()

	// 4. Rotation: wait for a new leaf in the server agent's OUTPUT_CERTS;
	// new RPCs on fresh connections succeed and see the new certificate.
	var newSerial string
	testwait.Within(t, 2*pxSecretTTL, "the server agent rotated its certificate", func() bool {
		leaf := serverAgent.leaf()
		if leaf != nil && leaf.SerialNumber.String() != firstSerial {
			newSerial = leaf.SerialNumber.String()
			return true
		}
		return false
	})
	clientFirst := clientAgent.leaf()
	testwait.Within(t, 2*pxSecretTTL, "the client agent rotated its certificate", func() bool {
		leaf := clientAgent.leaf()
		return leaf != nil && clientFirst != nil && leaf.SerialNumber.Cmp(clientFirst.SerialNumber) != 0
	})
	var lastErr error
	var seen string
	testwait.Within(t, 15*time.Second, "a fresh connection presents the rotated certificate", func() bool {
		c := pxClient(t, clientBuilder)
		defer c.Close()
		var p peer.Peer
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		if _, lastErr = testgrpc.NewTestServiceClient(c).EmptyCall(cctx, &testgrpc.Empty{}, grpc.Peer(&p), grpc.WaitForReady(true)); lastErr != nil {
			t.Logf("after rotation: %v", lastErr)
			return false
		}
		seen = pxServerSerial(t, &p)
		return seen != firstSerial
	})
	t.Logf("server certificate serial %s before rotation, %s after", firstSerial, seen)

	// Every workload's xDS traffic reached the control plane through its
	// own agent's proxy, with that agent's credentials.
	tokens := map[string]bool{}
	for _, c := range xs.Calls() {
		for _, v := range c.Metadata.Get("authorization") {
			tokens[v] = true
		}
	}
	for _, a := range agents {
		if !tokens["Bearer token-"+a.name] {
			t.Errorf("no xDS stream from agent %s reached the control plane (saw %v)", a.name, tokens)
		}
	}
	// Each agent's streams carried exactly the node ID built from its inputs.
	received := pxReceivedNodeIDs(xs)
	for _, a := range agents {
		if got := received["Bearer token-"+a.name]; !slices.Equal(got, []string{a.nodeID}) {
			t.Errorf("agent %s: the control plane received node IDs %q, want exactly %q", a.name, got, a.nodeID)
		}
	}
	if seen != newSerial && (serverAgent.leaf() == nil || seen != serverAgent.leaf().SerialNumber.String()) {
		t.Fatalf("the server presented serial %s, want the rotated %s", seen, newSerial)
	}
}

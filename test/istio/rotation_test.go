package istio

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/istiod"
	"github.com/meshagent/meshagent/test/kubeenv"
)

// newCA is istiod.NewCA, failing t.
func newCA(t *testing.T, cn string, parent *istiod.CA) *istiod.CA {
	t.Helper()
	ca, err := istiod.NewCA(cn, parent)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestRootRotationWithIstiod: istiod's plug-in CA moves from root A to root
// B, first publishing A and B together, then B alone, while two proxyless
// gRPC workloads (grpc-go's xDS client and server with the agents'
// bootstraps and certificate files, mTLS required by a STRICT
// PeerAuthentication) call each other every 100 ms. Not one call fails, and
// at each step every agent's ROOTCA, Workload API bundle and OUTPUT_CERTS
// root file hold what istiod publishes.
//
// The agents' CA root file is the namespace's ConfigMap istio-ca-root-cert,
// copied into place by the test as the kubelet updates a ConfigMap volume.
// It runs on an API server and istiod of its own: two istiods on one API
// server would both write that ConfigMap.
func TestRootRotationWithIstiod(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server and istiod")
	}
	env, err := kubeenv.Start(context.Background(), kubeenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Stop() })
	rootA, rootB := newCA(t, "root A", nil), newCA(t, "root B", nil)
	interA, interB := newCA(t, "istiod A", rootA), newCA(t, "istiod B", rootB)
	ca, err := istiod.Start(context.Background(), istiod.APIOf(env), istiod.Options{PluginCA: ptr(istiod.Plugin(interA, rootA, rootA))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ca.Stop() })

	const ns = "rotation"
	server := newWorkloadIn(t, env, ca, ns, "echo", "node-a")
	client := newWorkloadIn(t, env, ca, ns, "client", "node-a")
	applyMeshPolicy(t, env, ns)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	host := serviceAt(t, env, ns, port)

	// A third workload in the Envoy shape (its SDS socket serves ROOTCA and
	// the Workload API; a proxyless agent serves no socket) with files too.
	sidecar := newWorkloadIn(t, env, ca, ns, "web", "node-a")
	const ttl = 40 * time.Second
	agents := map[string]*agent{}
	envs := map[string][]string{}
	for _, w := range []*workload{server, client, sidecar} {
		stop := syncRoots(t, env, w)
		t.Cleanup(stop)
		shape := []string{"DISABLE_ENVOY=true", "GRPC_XDS_BOOTSTRAP=" + filepath.Join(w.dir, "grpc-bootstrap.json")}
		if w == sidecar {
			shape = []string{"MESHAGENT_XDS_PROXY=false"}
		}
		envs[w.sa] = append(shape,
			"INSTANCE_IP=127.0.0.1",
			"OUTPUT_CERTS="+filepath.Join(w.dir, "certs"),
			"SECRET_TTL="+ttl.String(),
		)
		agents[w.sa] = w.startSidecar(t, envs[w.sa]...)
	}
	for _, w := range []*workload{server, client} {
		agents[w.sa].waitFiles(t, 60*time.Second, proxylessFiles(w.dir)...)
	}
	agents[sidecar.sa].waitReady(t, 60*time.Second)

	// The server: grpc-go's xDS server on the server agent's bootstrap.
	serverBootstrap, err := os.ReadFile(filepath.Join(server.dir, "grpc-bootstrap.json"))
	if err != nil {
		t.Fatal(err)
	}
	screds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := xds.NewGRPCServer(grpc.Creds(screds), xds.BootstrapContentsForTesting(serverBootstrap))
	if err != nil {
		t.Fatalf("grpc-go rejects the server agent's bootstrap: %v", err)
	}
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)

	// The client: grpc-go's xDS resolver on the client agent's bootstrap.
	clientBootstrap, err := os.ReadFile(filepath.Join(client.dir, "grpc-bootstrap.json"))
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := xds.NewXDSResolverWithConfigForTesting(clientBootstrap)
	if err != nil {
		t.Fatal(err)
	}
	ccreds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///"+host+":"+strconv.Itoa(echoPort), grpc.WithTransportCredentials(ccreds), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	// The first call: over mTLS, the server's identity on the other end.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	var p peer.Peer
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true), grpc.Peer(&p))
	cancel()
	if err != nil {
		t.Fatalf("first call: %v", err)
	}
	if got := peerID(p); got != server.id() {
		t.Fatalf("the client sees %q at the other end, want %s over mTLS", got, server.id())
	}

	calls := startCalls(t, hc)
	step := func(what string, roots []*istiod.CA, signer *istiod.CA) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for _, w := range []*workload{server, client, sidecar} {
			a := agents[w.sa]
			// Each look opens connections to the agent's socket, which
			// limits a caller's connection rate: a look every 250 ms.
			testwait.Every(t, time.Until(deadline), 250*time.Millisecond, fmt.Sprintf("%s: agent %s to hold what istiod publishes (%d roots)", what, w.sa, len(roots)), func() error {
				return checkAgentRoots(t, w, a, w == sidecar, roots, signer)
			})
		}
		t.Logf("%s: every agent holds what istiod publishes (%d calls so far, %d failed)", what, calls.ok.Load(), calls.failed.Load())
	}
	step("root A", []*istiod.CA{rootA}, interA)

	// Old and new together: istiod signs with B, publishes A and B.
	if err := ca.SetPluginCA(istiod.Plugin(interB, rootB, rootA, rootB)); err != nil {
		t.Fatal(err)
	}
	step("roots A and B", []*istiod.CA{rootA, rootB}, interB)
	// gRPC's file watchers re-read the files every tenth of the lifetime:
	// two such periods later, no connection uses anything of A's chain.
	time.Sleep(2 * (ttl / 10))

	// Then the old root goes.
	if err := ca.SetPluginCA(istiod.Plugin(interB, rootB, rootB)); err != nil {
		t.Fatal(err)
	}
	step("root B", []*istiod.CA{rootB}, interB)
	time.Sleep(2 * (ttl / 10))

	ok, failed := calls.stop()
	rss, _ := ca.RSS()
	t.Logf("%d calls, %d failed; istiod's VmRSS %.0f MB", ok+failed, failed, float64(rss)/1e6)
	if failed != 0 {
		t.Fatalf("%d of %d calls failed during the rotation; first: %v", failed, ok+failed, calls.firstErr())
	}
	if ok < 100 {
		t.Fatalf("only %d calls made", ok)
	}

	// New connections after the rotation: the client's agent starts again
	// (a new connection to istiod, which checks client certificates against
	// the roots it started with) and a new gRPC client resolves and calls
	// through it, every handshake under root B alone.
	agents[client.sa].Stop()
	again := client.startSidecar(t, envs[client.sa]...)
	again.waitFiles(t, 60*time.Second, proxylessFiles(client.dir)...)
	resolver, err = xds.NewXDSResolverWithConfigForTesting(clientBootstrap)
	if err != nil {
		t.Fatal(err)
	}
	cc2, err := grpc.NewClient("xds:///"+host+":"+strconv.Itoa(echoPort), grpc.WithTransportCredentials(ccreds), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	// The first calls may find a route before its cluster (grpc-go's xDS
	// client on a new stream): try for a while.
	testwait.Every(t, 60*time.Second, 200*time.Millisecond, "a new connection after the rotation", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(cc2).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true), grpc.Peer(&p))
		return err
	})
	if got := peerID(p); got != server.id() {
		t.Fatalf("after the rotation the client sees %q, want %s", got, server.id())
	}
}

// checkAgentRoots says why agent a of w does not yet hold roots in its
// OUTPUT_CERTS root file and, when it serves a socket, in ROOTCA and its
// Workload API bundle, or a leaf issued by signer; nil when it does.
func checkAgentRoots(t *testing.T, w *workload, a *agent, socket bool, roots []*istiod.CA, signer *istiod.CA) error {
	file, err := os.ReadFile(filepath.Join(w.dir, "certs", files.RootCertFile))
	if err != nil {
		return err
	}
	if err := sameCerts(file, roots); err != nil {
		return errorf("OUTPUT_CERTS %s: %v", files.RootCertFile, err)
	}
	if socket {
		rootca, _ := a.fetch(t, "ROOTCA").TrustedCA("ROOTCA")
		if err := sameCerts(rootca, roots); err != nil {
			return errorf("ROOTCA: %v", err)
		}
		bundle, err := workloadAPIBundle(a.Socket())
		if err != nil {
			return errorf("Workload API: %v", err)
		}
		if err := sameCerts(bundle, roots); err != nil {
			return errorf("Workload API bundle: %v", err)
		}
		chain, _, _ := a.fetch(t, "default").Cert("default")
		leaf, err := firstCert(chain)
		if err != nil {
			return err
		}
		if err := leaf.CheckSignatureFrom(signer.Cert); err != nil {
			return errorf("default is not yet issued by %s", signer.Cert.Subject.CommonName)
		}
	}
	file, err = os.ReadFile(filepath.Join(w.dir, "certs", files.CertChainFile))
	if err != nil {
		return err
	}
	if leaf, err := firstCert(file); err != nil || leaf.CheckSignatureFrom(signer.Cert) != nil {
		return errorf("OUTPUT_CERTS %s is not yet issued by %s", files.CertChainFile, signer.Cert.Subject.CommonName)
	}
	return nil
}

// sameCerts says how bundle differs from exactly the certificates of want.
func sameCerts(bundle []byte, want []*istiod.CA) error {
	var got []*x509.Certificate
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return err
		}
		got = append(got, c)
	}
	if len(got) != len(want) {
		return errorf("%d certificates, want %d", len(got), len(want))
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || g.Equal(w.Cert)
		}
		if !found {
			return errorf("%s missing", w.Cert.Subject.CommonName)
		}
	}
	return nil
}

func firstCert(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errorf("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

// syncRoots copies w's namespace ConfigMap istio-ca-root-cert into w's CA
// root file whenever it changes, by rename, as the kubelet updates a
// ConfigMap volume; the returned function stops it.
func syncRoots(t *testing.T, env *kubeenv.Env, w *workload) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		last := w.root
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			roots, err := w.ca.Roots(ctx, w.ns)
			if err != nil || bytes.Equal(roots, last) {
				continue
			}
			tmp := filepath.Join(w.dir, ".root-cert.pem.tmp")
			if os.WriteFile(tmp, roots, 0o600) == nil && os.Rename(tmp, filepath.Join(w.dir, "root-cert.pem")) == nil {
				last = roots
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// applyMeshPolicy requires mTLS between the namespace's workloads: a STRICT
// PeerAuthentication for the servers and an ISTIO_MUTUAL DestinationRule for
// the clients (proxyless gRPC takes its client TLS from the DestinationRule).
func applyMeshPolicy(t *testing.T, env *kubeenv.Env, ns string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct {
		gvr schema.GroupVersionResource
		obj map[string]any
	}{
		{schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "peerauthentications"}, map[string]any{
			"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
			"metadata": map[string]any{"name": "default", "namespace": ns},
			"spec":     map[string]any{"mtls": map[string]any{"mode": "STRICT"}},
		}},
		{schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}, map[string]any{
			"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
			"metadata": map[string]any{"name": "mtls", "namespace": ns},
			"spec": map[string]any{"host": "*." + ns + ".svc.cluster.local",
				"trafficPolicy": map[string]any{"tls": map[string]any{"mode": "ISTIO_MUTUAL"}}},
		}},
	} {
		if _, err := dyn.Resource(o.gvr).Namespace(ns).Create(context.Background(), &unstructured.Unstructured{Object: o.obj}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// serviceAt is the Service "echo" of ns whose one endpoint is 127.0.0.1:port
// (a WorkloadEntry of the echo service account: the API server refuses
// loopback EndpointSlices). It returns the Service's host name.
func serviceAt(t *testing.T, env *kubeenv.Env, ns string, port int) string {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Client().CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "echo"},
			Ports: []corev1.ServicePort{{Name: "grpc", Port: echoPort, TargetPort: intstr.FromInt32(int32(port)),
				AppProtocol: ptr("grpc")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	we := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
		"metadata": map[string]any{"name": "echo-0", "namespace": ns},
		"spec": map[string]any{"address": "127.0.0.1", "labels": map[string]any{"app": "echo"},
			"serviceAccount": "echo"},
	}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "workloadentries"}).
		Namespace(ns).Create(ctx, we, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return "echo." + ns + ".svc.cluster.local"
}

// peerID is the URI SAN of the peer's certificate, "" without TLS.
func peerID(p peer.Peer) string {
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return ""
	}
	if uris := info.State.PeerCertificates[0].URIs; len(uris) == 1 {
		return uris[0].String()
	}
	return ""
}

// calls runs one health check every 100 ms until stopped, counting.
type calls struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	first      error
	cancel     context.CancelFunc
	done       chan struct{}
}

func startCalls(t *testing.T, hc healthpb.HealthClient) *calls {
	ctx, cancel := context.WithCancel(context.Background())
	c := &calls{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			callCtx, callCancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := hc.Check(callCtx, &healthpb.HealthCheckRequest{})
			callCancel()
			switch {
			case err == nil:
				c.ok.Add(1)
			case ctx.Err() != nil:
				return
			default:
				c.failed.Add(1)
				c.mu.Lock()
				if c.first == nil {
					c.first = err
				}
				c.mu.Unlock()
			}
		}
	}()
	t.Cleanup(c.stopNow)
	return c
}

func (c *calls) stopNow() { c.cancel(); <-c.done }

func (c *calls) stop() (ok, failed int64) {
	c.stopNow()
	return c.ok.Load(), c.failed.Load()
}

func (c *calls) firstErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.first
}

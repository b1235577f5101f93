package istio

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istiod"
	"github.com/meshagent/meshagent/test/podproc"
)

// nodeAgent is a node agent of node-a whose service account istiod trusts
// for impersonation (CA_TRUSTED_NODE_ACCOUNTS), its token bound to its own
// pod as the kubelet projects it.
type nodeAgent struct {
	*agent
	token string
}

func startNodeAgent(t *testing.T, ca *istiod.Istiod, node string) *nodeAgent {
	t.Helper()
	env := kube.Env(t)
	ctx := context.Background()
	if _, err := env.CreateNamespace(ctx, nodeAgentNamespace); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.CreateServiceAccount(ctx, nodeAgentNamespace, nodeAgentSA); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	agentPod, err := env.CreatePod(ctx, nodeAgentNamespace, uniq("meshagent-"+node), nodeAgentSA, node)
	if err != nil {
		t.Fatal(err)
	}
	token, err := env.Token(ctx, nodeAgentNamespace, nodeAgentSA, []string{istiod.Audience}, agentPod, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	root, err := ca.Roots(ctx, istiod.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	dir := agentproc.TempDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"istio-token": []byte(token), "root-cert.pem": root} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Kubeconfig(filepath.Join(dir, "kubeconfig"), env.AdminToken()); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	a := &agent{Proc: agentproc.Start(t, dir,
		"MESHAGENT_MODE=node",
		"NODE_NAME="+node,
		"KUBECONFIG="+filepath.Join(dir, "kubeconfig"),
		"CA_ADDR="+ca.SecureAddr,
		"ISTIOD_SAN="+istiod.ServerName,
		"CA_ROOT_CA="+filepath.Join(dir, "root-cert.pem"),
		"MESHAGENT_TOKEN_PATH="+filepath.Join(dir, "istio-token"),
		"ISTIO_META_CLUSTER_ID="+istiod.ClusterID,
		"POD_NAMESPACE="+nodeAgentNamespace,
		"SERVICE_ACCOUNT="+nodeAgentSA,
		"POD_NAME="+agentPod.Name,
		"STATUS_PORT="+strconv.Itoa(port),
		"MESHAGENT_STATUS_HOST=127.0.0.1",
		"MESHAGENT_LOG_LEVEL=debug",
	), status: "http://127.0.0.1:" + strconv.Itoa(port)}
	a.waitReady(t, 60*time.Second)
	return &nodeAgent{agent: a, token: token}
}

// TestNodeAgentWithIstiod: the node agent, trusted by istiod for its node,
// gets each pod of its node its own identity through impersonation; istiod
// refuses the same agent an identity whose pods all run on another node.
func TestNodeAgentWithIstiod(t *testing.T) {
	ca := control(t)
	env := kube.Env(t)
	ctx := context.Background()
	w := newWorkload(t, "api", "node-a")
	if _, err := env.CreateServiceAccount(ctx, w.ns, "batch"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.CreatePod(ctx, w.ns, "batch-0", "batch", "node-b"); err != nil {
		t.Fatal(err)
	}
	n := startNodeAgent(t, ca, "node-a")

	issuedBefore := istiodIssued(t, ca)
	leaf, err := podproc.FetchAsPod(t, n.Socket(), string(w.pod.UID), podproc.Cgroupfs, "default")
	if err != nil {
		t.Fatalf("pod %s/%s: %v\n%s", w.ns, w.pod.Name, err, n.Logs())
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != w.id() {
		t.Fatalf("pod got %v, want its own identity %s", leaf.URIs, w.id())
	}
	roots := x509.NewCertPool()
	for _, r := range parseCerts(t, "roots", w.root) {
		roots.AddCert(r)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("the pod's certificate is not istiod's: %v", err)
	}
	if got := istiodIssued(t, ca); got <= issuedBefore {
		t.Errorf("istiod's issuance count %v -> %v", issuedBefore, got)
	}

	// What istiod's node authorizer says to this agent, asked directly: yes
	// for a service account with a pod on node-a, no for one whose only pod
	// is on node-b.
	if _, err := impersonate(t, ca, n.token, w.id()); err != nil {
		t.Fatalf("istiod refused the agent its own node's pod: %v", err)
	}
	other := "spiffe://" + istiod.TrustDomain + "/ns/" + w.ns + "/sa/batch"
	_, err = impersonate(t, ca, n.token, other)
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("impersonating %s (pods only on node-b) from node-a's agent: %v, want Unauthenticated", other, err)
	}
}

// impersonate is one CreateCertificate to istiod with token and
// ImpersonatedIdentity id, as a node agent sends it.
func impersonate(t *testing.T, ca *istiod.Istiod, token, id string) ([]string, error) {
	t.Helper()
	ctx := context.Background()
	root, err := ca.Roots(ctx, istiod.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(root)
	cc, err := grpc.NewClient(ca.SecureAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, ServerName: istiod.ServerName, MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	return istiod.Impersonate(ctx, cc, token, id)
}

// TestProxyConfigTrustFromIstiod: with PROXY_CONFIG_XDS_AGENT, the agent's
// proxy asks istiod for ProxyConfig and merges the trust bundle istiod
// sends (its root and the mesh config's caCertificates) into ROOTCA: a root
// that only the mesh config names reaches the workload.
func TestProxyConfigTrustFromIstiod(t *testing.T) {
	w := newWorkload(t, "web", "node-a")
	a := w.startSidecar(t, "PROXY_CONFIG_XDS_AGENT=true")
	// Envoy's ADS stream: the proxy opens its upstream stream with it, and
	// subscribes to ProxyConfig there itself, as pilot-agent does.
	socket := filepath.Join(w.dir, "etc/istio/proxy/XDS")
	a.waitFiles(t, 60*time.Second, socket)
	newADSClient(t, socket, w).get(resourcev3.ClusterType, nil, func([]*anypb.Any) bool { return true })
	a.waitReady(t, 30*time.Second)
	extra := parseCerts(t, "extra root", meshExtraRoot)[0]
	var rootca []byte
	// A look is a new connection to the agent's socket, which limits a
	// caller's connection rate.
	testwait.Every(t, 30*time.Second, 100*time.Millisecond, "the mesh-config root from istiod's ProxyConfig in ROOTCA", func() error {
		rootca, _ = a.fetch(t, "ROOTCA").TrustedCA("ROOTCA")
		if !containsCert(t, rootca, extra) {
			return fmt.Errorf("ROOTCA holds %d bytes without it", len(rootca))
		}
		return nil
	})
	// istiod's own root stays beside it.
	if own := parseCerts(t, "istiod root", w.root)[0]; !containsCert(t, rootca, own) {
		t.Fatalf("ROOTCA lost istiod's own root:\n%s", rootca)
	}
}

func containsCert(t *testing.T, bundle []byte, c *x509.Certificate) bool {
	t.Helper()
	if len(bytes.TrimSpace(bundle)) == 0 {
		return false
	}
	for _, b := range parseCerts(t, "bundle", bundle) {
		if b.Equal(c) {
			return true
		}
	}
	return false
}

package podcert

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	certsv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/meshagent/meshagent/caclient/istio"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/kubeenv"
)

// The test nodes: the signer runs for nodeA; nodeB's requests are another
// agent's.
const (
	nodeA      = "node-a"
	nodeB      = "node-b"
	testSigner = "meshagent.io/workload-identity"
	agentSA    = "meshagent"
)

// kube is the package's API server, with a kubelet token per node and the
// node restriction on, so requests are created as a kubelet would and the
// API server checks them as it checks a kubelet's.
var kube = &kubeenv.Shared{Options: kubeenv.Options{
	Nodes:          []string{nodeA, nodeB},
	APIServerFlags: []string{"--enable-admission-plugins=NodeRestriction"},
}}

// testTTL is the life the signer asks of the CA in these tests
// (SECRET_TTL's default).
const testTTL = 24 * time.Hour

func TestMain(m *testing.M) { os.Exit(kube.Main(m)) }

// nodesOnce creates the Node objects the node restriction checks requests
// against.
var nodesOnce sync.Once

// cluster is what a test of the signer runs against: the API server, its
// nodes, a namespace of the test's own, the agent's service account and
// pod on nodeA, and a test Istio CA that trusts that account as a node
// agent (istiod's node authorizer).
type cluster struct {
	t     *testing.T
	env   *kubeenv.Env
	admin kubernetes.Interface
	ns    string
	sys   string
	// signer is the cluster's signer name, its own so that a signer never
	// sees the requests of an earlier test (go test -count=2 included):
	// namespaces are not emptied here, there is no controller manager.
	signer string
	ca     *istioca.Server
	// agentToken is the agent's own token, bound to its pod on nodeA.
	agentToken string
	// podGate, when set, holds the pod index's list and watch until it is
	// closed: the node's pods arrive after its requests.
	podGate <-chan struct{}
}

// gatedPods holds a pod source's list and watch until gate is closed.
type gatedPods struct {
	src  podindex.PodSource
	gate <-chan struct{}
}

func (g gatedPods) PodListWatch(fieldSelector string) cache.ListerWatcher {
	return gatedListWatch{g.src.PodListWatch(fieldSelector), g.gate}
}

type gatedListWatch struct {
	lw   cache.ListerWatcher
	gate <-chan struct{}
}

func (g gatedListWatch) List(o metav1.ListOptions) (runtime.Object, error) {
	<-g.gate
	return g.lw.List(o)
}

func (g gatedListWatch) Watch(o metav1.ListOptions) (watch.Interface, error) {
	<-g.gate
	return g.lw.Watch(o)
}

func newCluster(t *testing.T, caCfg istioca.Config) *cluster {
	t.Helper()
	env := kube.Env(t)
	ctx := context.Background()
	c := &cluster{t: t, env: env, admin: env.Client(), ns: uniq("pc"), sys: uniq("sys")}
	c.signer = testSigner + "-" + c.ns
	nodesOnce.Do(func() {
		for _, n := range []string{nodeA, nodeB} {
			_, err := c.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
	})
	for _, ns := range []string{c.ns, c.sys} {
		if _, err := env.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.CreateServiceAccount(ctx, c.sys, agentSA); err != nil {
		t.Fatal(err)
	}
	agentPod, err := env.CreatePod(ctx, c.sys, "meshagent", agentSA, nodeA)
	if err != nil {
		t.Fatal(err)
	}
	caCfg.Kube = c.admin
	caCfg.KeyOnlyCSR = true
	caCfg.TrustedNodeAccounts = []istioca.ServiceAccount{{Namespace: c.sys, Name: agentSA}}
	c.ca = istioca.Start(t, caCfg)
	c.agentToken, err = env.Token(ctx, c.sys, agentSA, []string{istioca.DefaultAudience}, agentPod, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var seq struct {
	sync.Mutex
	n int
}

func uniq(prefix string) string {
	seq.Lock()
	defer seq.Unlock()
	seq.n++
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e6, seq.n)
}

type staticToken string

func (s staticToken) Token(context.Context) (string, error) { return string(s), nil }

// agentCA is the node agent's client of the test CA: its own token, the
// pods' identities asked with ImpersonatedIdentity.
func (c *cluster) agentCA() *istio.Client {
	c.t.Helper()
	client, err := istio.New(istio.Config{
		Transport: controlplane.Config{
			Addr: c.ca.Addr(), ServerName: istioca.DefaultServerName,
			Roots: controlplane.StaticRoots{Pool: c.ca.Roots()}, Token: staticToken(c.agentToken),
		},
		Identity: pki.SPIFFEIdentity("cluster.local", c.sys, agentSA),
	})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = client.Close() })
	return client
}

// startSigner runs a signer for nodeA with the node's pod index and the
// agent's certificate cache (its CSRs signed by the agent's CA client) over
// the CA's roots, until the test ends. edit changes the signer's
// configuration and editCache the cache's, first.
func (c *cluster) startSigner(edit func(*Config)) (*Signer, *secretmanager.Roots) {
	return c.startSignerCache(edit, nil)
}

func (c *cluster) startSignerCache(edit func(*Config), editCache func(*secretmanager.Config)) (*Signer, *secretmanager.Roots) {
	c.t.Helper()
	admin, err := kubeclient.NewForConfig(c.env.Config())
	if err != nil {
		c.t.Fatal(err)
	}
	scheme, err := pki.IstioScheme("cluster.local")
	if err != nil {
		c.t.Fatal(err)
	}
	var pods podindex.PodSource = admin
	if c.podGate != nil {
		pods = gatedPods{admin, c.podGate}
	}
	idx, err := podindex.New(podindex.Config{Pods: pods, NodeName: nodeA, Scheme: scheme})
	if err != nil {
		c.t.Fatal(err)
	}
	api, err := kubeclient.NewCertificates(c.env.Config())
	if err != nil {
		c.t.Fatal(err)
	}
	roots, err := secret.NewRoots(c.ca.RootPEM(), "test-ca")
	if err != nil {
		c.t.Fatal(err)
	}
	mc := secretmanager.Config{
		Roots: roots, CSRSigner: c.agentCA(),
		BackoffBase: 10 * time.Millisecond, BackoffCap: 100 * time.Millisecond,
		TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute,
	}
	if editCache != nil {
		editCache(&mc)
	}
	m, err := secretmanager.New(mc)
	if err != nil {
		c.t.Fatal(err)
	}
	cfg := Config{
		SignerName: c.signer, NodeName: nodeA, API: api, Pods: idx, Roots: roots, CA: m,
		BackoffBase: 10 * time.Millisecond, BackoffCap: 100 * time.Millisecond,
		TTL: testTTL, RefreshRatio: 0.5, RefreshJitter: 0.01, Workers: 8,
	}
	if edit != nil {
		edit(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = idx.Run(ctx) })
	wg.Go(func() { _ = m.Run(ctx) })
	wg.Go(func() {
		if err := s.Run(ctx); err != nil {
			c.t.Errorf("signer: %v", err)
		}
	})
	c.t.Cleanup(func() { cancel(); wg.Wait() })
	return s, roots
}

// pod creates a pod of service account sa (made if missing) on node with a
// podCertificate volume for the signer, as the node restriction requires
// of a pod its kubelet asks a certificate for.
func (c *cluster) pod(name, sa, node string) *corev1.Pod {
	c.t.Helper()
	ctx := context.Background()
	if _, err := c.admin.CoreV1().ServiceAccounts(c.ns).Get(ctx, sa, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := c.env.CreateServiceAccount(ctx, c.ns, sa); err != nil {
			c.t.Fatal(err)
		}
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			NodeName:           node,
			Containers:         []corev1.Container{{Name: "app", Image: kubeenv.PodImage}},
			Volumes: []corev1.Volume{{Name: "mesh-identity", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{
					SignerName: c.signer, KeyType: "ECDSAP256", CredentialBundlePath: "credentialbundle.pem",
				}}},
			}}}},
		},
	}
	p, err := c.admin.CoreV1().Pods(c.ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

// request creates a PodCertificateRequest for pod as its node's kubelet
// does: through the node's own identity, with a stub CSR signed by key.
func (c *cluster) request(pod *corev1.Pod, key crypto.Signer, maxExp int32, annotations map[string]string) *certsv1.PodCertificateRequest {
	c.t.Helper()
	// The API server's admission reads pods from its own cache, which
	// may not hold a pod created a moment ago: it answers NotFound then.
	var (
		req *certsv1.PodCertificateRequest
		err error
	)
	testwait.For(c.t, "the API server's admission to see pod "+pod.Name, func() bool {
		req, err = c.requestAs(pod.Spec.NodeName, pod, key, maxExp, annotations)
		return !apierrors.IsNotFound(err) && (err == nil || !strings.Contains(err.Error(), "not found"))
	})
	if err != nil {
		c.t.Fatalf("the kubelet of %s cannot create the request: %v", pod.Spec.NodeName, err)
	}
	return req
}

// requestAs creates the request for pod through the identity of kubelet's
// node.
func (c *cluster) requestAs(kubeletNode string, pod *corev1.Pod, key crypto.Signer, maxExp int32, annotations map[string]string) (*certsv1.PodCertificateRequest, error) {
	c.t.Helper()
	ctx := context.Background()
	node := pod.Spec.NodeName
	n, err := c.admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	sa, err := c.admin.CoreV1().ServiceAccounts(pod.Namespace).Get(ctx, pod.Spec.ServiceAccountName, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	stub, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		c.t.Fatal(err)
	}
	kubelet, err := kubernetes.NewForConfig(c.env.ConfigForToken(c.env.NodeToken(kubeletNode)))
	if err != nil {
		c.t.Fatal(err)
	}
	var maxp *int32
	if maxExp > 0 {
		maxp = &maxExp
	}
	return kubelet.CertificatesV1().PodCertificateRequests(pod.Namespace).Create(ctx, &certsv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + "-"},
		Spec: certsv1.PodCertificateRequestSpec{
			SignerName:                c.signer,
			PodName:                   pod.Name,
			PodUID:                    pod.UID,
			ServiceAccountName:        sa.Name,
			ServiceAccountUID:         sa.UID,
			NodeName:                  types.NodeName(node),
			NodeUID:                   n.UID,
			MaxExpirationSeconds:      maxp,
			StubPKCS10Request:         stub,
			UnverifiedUserAnnotations: annotations,
		},
	}, metav1.CreateOptions{})
}

// answer waits for req's terminal condition and returns the request then.
func (c *cluster) answer(req *certsv1.PodCertificateRequest) (*certsv1.PodCertificateRequest, metav1.Condition) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := c.admin.CertificatesV1().PodCertificateRequests(req.Namespace).Get(context.Background(), req.Name, metav1.GetOptions{})
		if err != nil {
			c.t.Fatal(err)
		}
		for _, cond := range got.Status.Conditions {
			switch cond.Type {
			case "Issued", "Denied", "Failed":
				return got, cond
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("request %s/%s not answered in 60s: %+v", req.Namespace, req.Name, got.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// spiffeID is the identity of service account sa of the test's namespace.
func (c *cluster) spiffeID(sa string) string {
	return "spiffe://cluster.local/ns/" + c.ns + "/sa/" + sa
}

// checkIssued checks an issued request: the leaf is for key and id, its
// times are the status's, and it verifies to the CA's root.
func (c *cluster) checkIssued(got *certsv1.PodCertificateRequest, key crypto.Signer, id string) *x509.Certificate {
	c.t.Helper()
	chain, err := pki.ParseCertificates([]byte(got.Status.CertificateChain))
	if err != nil {
		c.t.Fatalf("certificateChain: %v", err)
	}
	leaf := chain[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id || len(leaf.DNSNames) != 0 {
		c.t.Errorf("leaf names %v %v, want only %s", leaf.URIs, leaf.DNSNames, id)
	}
	if !pki.PublicKeysEqual(leaf.PublicKey, key.Public()) {
		c.t.Error("the leaf is not for the request's key")
	}
	if !got.Status.NotBefore.Time.Equal(leaf.NotBefore) || !got.Status.NotAfter.Time.Equal(leaf.NotAfter) {
		c.t.Errorf("status times %s..%s, leaf %s..%s", got.Status.NotBefore, got.Status.NotAfter, leaf.NotBefore, leaf.NotAfter)
	}
	inter := x509.NewCertPool()
	for _, ic := range chain[1:] {
		if ic.Equal(c.ca.CA().Root()) {
			c.t.Error("the chain carries the root")
		}
		inter.AddCert(ic)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.ca.Roots(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		c.t.Errorf("the chain does not verify to the CA's root: %v", err)
	}
	return leaf
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

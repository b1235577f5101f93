package podcerts

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	certsv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/podcert"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/kubeenv"
)

const (
	nodeA   = "pc-node-a"
	nodeB   = "pc-node-b"
	signer  = "meshagent.io/workload-identity"
	agentSA = "meshagent"
)

var kube = &kubeenv.Shared{Options: kubeenv.Options{
	Nodes:          []string{nodeA, nodeB},
	APIServerFlags: []string{"--enable-admission-plugins=NodeRestriction"},
}}

func TestMain(m *testing.M) { os.Exit(kube.Main(m)) }

// The built agent, in node mode on nodeA with only the chart's RBAC, signs
// the request of a pod of its node for the pod's SPIFFE ID and key, leaves
// another node's alone and denies a key type it cannot issue for.
func TestNodeAgentSignsPodCertificates(t *testing.T) {
	env := kube.Env(t)
	admin := env.Client()
	ctx := context.Background()
	for _, n := range []string{nodeA, nodeB} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	sys, ns := env.TestNamespace(t), env.TestNamespace(t)
	if _, err := env.CreateServiceAccount(ctx, sys, agentSA); err != nil {
		t.Fatal(err)
	}
	bindChartRBAC(t, admin, "meshagent", sys)
	agentPod, err := env.CreatePod(ctx, sys, "meshagent-"+nodeA, agentSA, nodeA)
	if err != nil {
		t.Fatal(err)
	}
	ca := istioca.Start(t, istioca.Config{Kube: admin, KeyOnlyCSR: true,
		TrustedNodeAccounts: []istioca.ServiceAccount{{Namespace: sys, Name: agentSA}}})
	caToken, err := env.Token(ctx, sys, agentSA, []string{istioca.DefaultAudience}, agentPod, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The agent's API credentials: its own service account's token, with
	// the chart's RBAC and nothing else.
	apiToken, err := env.Token(ctx, sys, agentSA, nil, agentPod, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := agentproc.TempDir(t)
	write(t, filepath.Join(dir, "istio-token"), []byte(caToken))
	write(t, filepath.Join(dir, "root-cert.pem"), ca.RootPEM())
	if err := env.Kubeconfig(filepath.Join(dir, "kubeconfig"), apiToken); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	agent := agentproc.Start(t, dir,
		"MESHAGENT_MODE=node",
		"NODE_NAME="+nodeA,
		"MESHAGENT_POD_CERTIFICATE_SIGNER="+signer,
		"KUBECONFIG="+filepath.Join(dir, "kubeconfig"),
		"CA_ADDR="+ca.Addr(),
		"ISTIOD_SAN="+istioca.DefaultServerName,
		"CA_ROOT_CA="+filepath.Join(dir, "root-cert.pem"),
		"MESHAGENT_TOKEN_PATH="+filepath.Join(dir, "istio-token"),
		"POD_NAMESPACE="+sys,
		"SERVICE_ACCOUNT="+agentSA,
		"POD_NAME="+agentPod.Name,
		"STATUS_PORT="+strconv.Itoa(port),
		"MESHAGENT_STATUS_HOST=127.0.0.1",
	)
	status := "http://127.0.0.1:" + strconv.Itoa(port)
	eventually(t, "the agent ready", func() bool {
		if agent.ExitCode() >= 0 {
			t.Fatalf("agent exited:\n%s", agent.Logs())
		}
		code, _ := get(status + "/healthz/ready")
		return code == http.StatusOK
	})

	elsewhere := request(t, env, pod(t, env, ns, "elsewhere", "web", nodeB), ecKey(t))
	key := ecKey(t)
	got, cond := answer(t, admin, request(t, env, pod(t, env, ns, "web-0", "web", nodeA), key))
	if cond.Type != "Issued" {
		t.Fatalf("condition %+v, want Issued\n%s", cond, agent.Logs())
	}
	chain, err := pki.ParseCertificates([]byte(got.Status.CertificateChain))
	if err != nil {
		t.Fatal(err)
	}
	leaf := chain[0]
	if want := "spiffe://cluster.local/ns/" + ns + "/sa/web"; len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		t.Errorf("leaf URIs %v, want %s", leaf.URIs, want)
	}
	if !pki.PublicKeysEqual(leaf.PublicKey, key.Public()) {
		t.Error("the leaf is not for the request's key")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Roots(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("chain: %v", err)
	}

	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, cond = answer(t, admin, request(t, env, pod(t, env, ns, "ed", "web", nodeA), ed))
	if cond.Type != "Denied" || cond.Reason != "UnsupportedKeyType" || !strings.Contains(cond.Message, "ECDSAP256") {
		t.Errorf("ED25519: condition %+v, want Denied UnsupportedKeyType suggesting ECDSAP256", cond)
	}

	other, err := admin.CertificatesV1().PodCertificateRequests(ns).Get(ctx, elsewhere.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(other.Status.Conditions) != 0 {
		t.Errorf("another node's request was answered: %+v", other.Status)
	}
	// The stub CSRs name nothing; the agent's own CSRs (its identity, the
	// SDS certificates of the node's identities) name their identity.
	stubs := 0
	for _, r := range ca.CSRs() {
		if r.Identity == "" {
			stubs++
		}
	}
	if stubs != 1 {
		t.Errorf("the CA got %d stub CSRs, want 1 (the other node's request is not the agent's, the denied one is not sent)", stubs)
	}

	// The agent counts a request once the API server took its status: the
	// test may see the status first.
	var metrics string
	answered := func() bool {
		_, metrics = get(status + "/metrics")
		return strings.Contains(metrics, `meshagent_podcert_requests_total{condition="issued"} 1`) &&
			strings.Contains(metrics, `meshagent_podcert_requests_total{condition="denied"} 1`)
	}
	defer func() {
		if t.Failed() {
			t.Logf("the agent's pod certificate metrics:\n%s", grep(metrics, "meshagent_podcert"))
		}
	}()
	testwait.For(t, "the answered requests in the metrics (1 issued, 1 denied)", answered)
}

// A node agent's API token is bound to its pod, and the API server names
// the pod's node in the token's user (the extra
// authentication.kubernetes.io/node-name): with the chart's policy the
// agent of nodeA writes the status of nodeA's requests, and the API server
// refuses it another node's, so a compromised node can neither deny, fail
// nor issue (to a victim's key) another node's requests. A token bound to
// no pod names no node and is refused too.
func TestNodeAgentAnswersItsOwnNodesRequestsAlone(t *testing.T) {
	env := kube.Env(t)
	admin := env.Client()
	ctx := context.Background()
	for _, n := range []string{nodeA, nodeB} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	sys, ns := env.TestNamespace(t), env.TestNamespace(t)
	if _, err := env.CreateServiceAccount(ctx, sys, agentSA); err != nil {
		t.Fatal(err)
	}
	bindChartRBAC(t, admin, "own-node", sys)
	agentPod, err := env.CreatePod(ctx, sys, "meshagent-"+nodeA, agentSA, nodeA)
	if err != nil {
		t.Fatal(err)
	}
	client := func(p *corev1.Pod) kubernetes.Interface {
		token, err := env.Token(ctx, sys, agentSA, nil, p, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, err := kubernetes.NewForConfig(env.ConfigForToken(token))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	agent, unbound := client(agentPod), client(nil)
	fail := func(c kubernetes.Interface, req *certsv1.PodCertificateRequest) func(dryRun []string) error {
		return func(dryRun []string) error {
			out := req.DeepCopy()
			out.Status.Conditions = append(out.Status.Conditions, metav1.Condition{
				Type: "Failed", Status: metav1.ConditionTrue, Reason: "Test", Message: "answered by the agent of " + nodeA,
				LastTransitionTime: metav1.Now(), ObservedGeneration: req.Generation,
			})
			_, err := c.CertificatesV1().PodCertificateRequests(req.Namespace).UpdateStatus(ctx, out, metav1.UpdateOptions{DryRun: dryRun})
			return err
		}
	}
	theirs := request(t, env, pod(t, env, ns, "theirs", "web", nodeB), ecKey(t))
	if err := oncePoliciesEnforce(t, fail(agent, theirs)); err == nil || !strings.Contains(err.Error(), "its own node") {
		t.Errorf("the agent of %s failing a request of %s: %v, want the policy's refusal", nodeA, nodeB, err)
	}
	if got, err := admin.CertificatesV1().PodCertificateRequests(ns).Get(ctx, theirs.Name, metav1.GetOptions{}); err != nil || len(got.Status.Conditions) != 0 {
		t.Errorf("another node's request after the refusal: %+v (%v), want it unanswered", got.Status, err)
	}
	mine := request(t, env, pod(t, env, ns, "mine", "web", nodeA), ecKey(t))
	if err := fail(agent, mine)(nil); err != nil {
		t.Errorf("the agent of %s failing a request of its own node: %v", nodeA, err)
	}
	other := request(t, env, pod(t, env, ns, "mine-too", "web", nodeA), ecKey(t))
	if err := fail(unbound, other)(nil); err == nil || !strings.Contains(err.Error(), "its own node") {
		t.Errorf("a token bound to no pod answering a request: %v, want the policy's refusal", err)
	}
}

// bindChartRBAC renders the chart's RBAC for release with a signer (the node
// agent's and the trust publisher's) and creates its ClusterRoles, their
// bindings, its ValidatingAdmissionPolicies and their bindings (admission
// enforces them a moment later: see oncePoliciesEnforce) and the publisher's
// service account in sys, whose name it returns.
func bindChartRBAC(t *testing.T, admin kubernetes.Interface, release, sys string) (publisherSA string) {
	t.Helper()
	helm, err := kubeenv.ToolPath("helm")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(helm, "template", release, "../../deploy/helm/meshagent", "--namespace", sys,
		"--set", "sidecar.enabled=false", "--set", "node.enabled=true",
		"--set", "node.serviceAccount.name="+agentSA, "--set", "node.podCertificateSigner="+signer,
		"--show-only", "templates/rbac.yaml", "--show-only", "templates/trust-publisher.yaml",
		"--show-only", "templates/admission.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	ctx := context.Background()
	roles, policies := 0, 0
	for _, doc := range bytes.Split(out, []byte("\n---")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("chart: %v\n%s", err, doc)
		}
		switch meta.Kind {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			mustUnmarshal(t, doc, &r)
			if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &r, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			// Cluster-scoped: removed when the test ends, for the next run's.
			t.Cleanup(func() { _ = admin.RbacV1().ClusterRoles().Delete(context.Background(), r.Name, metav1.DeleteOptions{}) })
			roles++
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			mustUnmarshal(t, doc, &b)
			if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &b, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), b.Name, metav1.DeleteOptions{})
			})
		case "ServiceAccount":
			var sa corev1.ServiceAccount
			mustUnmarshal(t, doc, &sa)
			if _, err := admin.CoreV1().ServiceAccounts(sys).Create(ctx, &sa, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			publisherSA = sa.Name
		case "ValidatingAdmissionPolicy":
			var p admissionv1.ValidatingAdmissionPolicy
			mustUnmarshal(t, doc, &p)
			if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(context.Background(), p.Name, metav1.DeleteOptions{})
			})
			policies++
		case "ValidatingAdmissionPolicyBinding":
			var b admissionv1.ValidatingAdmissionPolicyBinding
			mustUnmarshal(t, doc, &b)
			if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &b, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(context.Background(), b.Name, metav1.DeleteOptions{})
			})
		}
	}
	if policies != 2 {
		t.Fatalf("%d ValidatingAdmissionPolicies in the chart, want the node agents' and the trust publisher's:\n%s", policies, out)
	}
	if roles != 2 {
		t.Fatalf("%d ClusterRoles in the chart's RBAC, want the node agent's and the trust publisher's:\n%s", roles, out)
	}
	return publisherSA
}

func mustUnmarshal(t *testing.T, doc []byte, out any) {
	t.Helper()
	if err := yaml.Unmarshal(doc, out); err != nil {
		t.Fatalf("chart: %v\n%s", err, doc)
	}
}

// pod creates a pod of sa (made if missing) on node, mounting a
// podCertificate volume of the signer.
func pod(t *testing.T, env *kubeenv.Env, ns, name, sa, node string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Client().CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := env.CreateServiceAccount(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	p, err := env.Client().CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			NodeName:           node,
			Containers:         []corev1.Container{{Name: "app", Image: kubeenv.PodImage}},
			Volumes: []corev1.Volume{{Name: "mesh-identity", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{
					SignerName: signer, KeyType: "ECDSAP256", CredentialBundlePath: "credentialbundle.pem",
				}}},
			}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// request creates the request for p as its node's kubelet does, through
// the node's identity.
func request(t *testing.T, env *kubeenv.Env, p *corev1.Pod, key crypto.Signer) *certsv1.PodCertificateRequest {
	t.Helper()
	ctx := context.Background()
	node, err := env.Client().CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := env.Client().CoreV1().ServiceAccounts(p.Namespace).Get(ctx, p.Spec.ServiceAccountName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stub, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	kubelet, err := kubernetes.NewForConfig(env.ConfigForToken(env.NodeToken(p.Spec.NodeName)))
	if err != nil {
		t.Fatal(err)
	}
	req, err := kubelet.CertificatesV1().PodCertificateRequests(p.Namespace).Create(ctx, &certsv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: p.Name + "-"},
		Spec: certsv1.PodCertificateRequestSpec{
			SignerName: signer, PodName: p.Name, PodUID: p.UID,
			ServiceAccountName: sa.Name, ServiceAccountUID: sa.UID,
			NodeName: types.NodeName(node.Name), NodeUID: node.UID,
			StubPKCS10Request: stub,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the kubelet of %s: %v", p.Spec.NodeName, err)
	}
	return req
}

func answer(t *testing.T, admin kubernetes.Interface, req *certsv1.PodCertificateRequest) (*certsv1.PodCertificateRequest, metav1.Condition) {
	t.Helper()
	var (
		got  *certsv1.PodCertificateRequest
		cond metav1.Condition
	)
	eventually(t, "an answer to "+req.Name, func() bool {
		var err error
		got, err = admin.CertificatesV1().PodCertificateRequests(req.Namespace).Get(context.Background(), req.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range got.Status.Conditions {
			if c.Type == "Issued" || c.Type == "Denied" || c.Type == "Failed" {
				cond = c
				return true
			}
		}
		return false
	})
	return got, cond
}

func ecKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grep(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Within(t, 60*time.Second, what, cond)
}

// The built trust publisher, with only the chart's RBAC for it, publishes the
// roots file as the signer's ClusterTrustBundle and follows the file; the node
// agent's service account, with only the chart's RBAC for it, can neither
// create, change nor delete a bundle of the signer: one compromised node
// cannot make the cluster's pods trust a root of its own.
func TestOnlyThePublisherWritesTrust(t *testing.T) {
	env := kube.Env(t)
	admin := env.Client()
	ctx := context.Background()
	sys := env.TestNamespace(t)
	if _, err := env.CreateServiceAccount(ctx, sys, agentSA); err != nil {
		t.Fatal(err)
	}
	publisherSA := bindChartRBAC(t, admin, "trust", sys)
	ca := istioca.Start(t, istioca.Config{})
	attacker := istioca.Start(t, istioca.Config{})
	name := podcert.BundleName(signer)
	t.Cleanup(func() {
		_ = admin.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	bundleOf := func(rootPEM []byte, name string) *certsv1.ClusterTrustBundle {
		return &certsv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       certsv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: string(rootPEM)},
		}
	}
	agentToken, err := env.Token(ctx, sys, agentSA, nil, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	node, err := kubernetes.NewForConfig(env.ConfigForToken(agentToken))
	if err != nil {
		t.Fatal(err)
	}
	// Before the publisher: a node agent cannot be first either.
	if _, err := node.CertificatesV1().ClusterTrustBundles().Create(ctx, bundleOf(attacker.RootPEM(), name), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the node agent creating the signer's bundle: %v, want Forbidden", err)
	}

	pubToken, err := env.Token(ctx, sys, publisherSA, nil, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := agentproc.TempDir(t)
	roots := filepath.Join(dir, "root-cert.pem")
	write(t, roots, ca.RootPEM())
	if err := env.Kubeconfig(filepath.Join(dir, "kubeconfig"), pubToken); err != nil {
		t.Fatal(err)
	}
	pub := agentproc.StartCommand(t, dir, []string{"trust-publisher", "--signer=" + signer, "--roots=" + roots,
		"--kubeconfig=" + filepath.Join(dir, "kubeconfig")})
	published := func(want []byte) func() bool {
		return func() bool {
			if pub.ExitCode() >= 0 {
				t.Fatalf("trust publisher exited:\n%s", pub.Logs())
			}
			b, err := admin.CertificatesV1().ClusterTrustBundles().Get(ctx, name, metav1.GetOptions{})
			return err == nil && b.Spec.SignerName == signer && b.Spec.TrustBundle == string(want)
		}
	}
	eventually(t, "the ClusterTrustBundle with the CA's root", published(ca.RootPEM()))

	// Reading it is not the chart's grant to refuse: roots are public.
	cur, err := admin.CertificatesV1().ClusterTrustBundles().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.TrustBundle = string(attacker.RootPEM())
	if _, err := node.CertificatesV1().ClusterTrustBundles().Update(ctx, cur, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node agent rewriting the bundle: %v, want Forbidden", err)
	}
	if _, err := node.CertificatesV1().ClusterTrustBundles().Create(ctx, bundleOf(attacker.RootPEM(), strings.ReplaceAll(signer, "/", ":")+":evil"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node agent adding a bundle of the signer: %v, want Forbidden", err)
	}
	if err := node.CertificatesV1().ClusterTrustBundles().Delete(ctx, name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node agent deleting the bundle: %v, want Forbidden", err)
	}

	// The publisher's own credentials write that bundle alone: RBAC cannot
	// limit a create by name, the chart's policy does. (With attest on the
	// signer, RBAC alone let it add bundles of the signer under any name,
	// and bundles of no signer at all.)
	publisher, err := kubernetes.NewForConfig(env.ConfigForToken(pubToken))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []*certsv1.ClusterTrustBundle{
		bundleOf(attacker.RootPEM(), strings.ReplaceAll(signer, "/", ":")+":extra"),
		{ObjectMeta: metav1.ObjectMeta{Name: "unsigned-roots"}, Spec: certsv1.ClusterTrustBundleSpec{TrustBundle: string(attacker.RootPEM())}},
	} {
		err := oncePoliciesEnforce(t, func(dryRun []string) error {
			_, err := publisher.CertificatesV1().ClusterTrustBundles().Create(ctx, b, metav1.CreateOptions{DryRun: dryRun})
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "alone") {
			_ = admin.CertificatesV1().ClusterTrustBundles().Delete(ctx, b.Name, metav1.DeleteOptions{})
			t.Errorf("the trust publisher creating bundle %s: %v, want the policy's refusal", b.Name, err)
		}
	}

	// A rotation: the file gains a root; the publisher follows it alone.
	next := istioca.Start(t, istioca.Config{})
	both := append(append([]byte(nil), ca.RootPEM()...), next.RootPEM()...)
	write(t, roots, both)
	eventually(t, "the ClusterTrustBundle with both roots", published(both))
}

// oncePoliciesEnforce runs op as a dry run (which passes admission and
// changes nothing) until admission refuses it, for at most eventually's
// time (a policy reaches admission a moment after it is created), then
// runs it for real and returns its error: nil means the policy never
// refused it.
func oncePoliciesEnforce(t *testing.T, op func(dryRun []string) error) error {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := op([]string{metav1.DryRunAll})
		if err != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return op(nil)
}

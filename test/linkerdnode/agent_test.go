package linkerdnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/csi"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/linkerdca"
	"github.com/meshagent/meshagent/test/podproc"
)

// fetchAsPod fetches "default" from the agent's socket as a process of pod
// uid, and returns the leaf's DNS SANs, comma-separated, and its URI SAN
// count, or "error: ...".
func fetchAsPod(t *testing.T, sock, uid string) string {
	t.Helper()
	cert, err := podproc.FetchAsPod(t, sock, uid, podproc.Cgroupfs, "default")
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%s uris=%d", strings.Join(cert.DNSNames, ","), len(cert.URIs))
}

// grantNodeAgent gives ns/sa what the chart's node ClusterRole gives the
// agent with Linkerd: list and watch pods, nothing else (no token creation:
// the pods' tokens come from the kubelet through the CSI driver).
func grantNodeAgent(t *testing.T, ns, sa string) {
	t.Helper()
	ctx := context.Background()
	name := "meshagent-node-" + ns
	rbac := kube.Env(t).Client().RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestLinkerdNodeModeTokensPerServiceAccount: one node agent, Linkerd's
// identity protocol, two pods of different service accounts on the node,
// and the node's CSI driver, to which the test hands each pod's
// identity.l5d.io token as the kubelet does (NodePublishVolume over the
// driver's gRPC socket, the CSIDriver's tokenRequests). The agent has no
// right to create tokens. Each pod gets a certificate whose only name is its
// own Linkerd identity; the identity service saw each CSR with a token of
// that identity's own service account, bound to a pod of it on the node
// (its TokenReview log). After the pod the token was bound to is
// unpublished and deleted, another pod of the same service account keeps
// the identity working: the next CSR carries the token handed over for
// that pod.
func TestLinkerdNodeModeTokensPerServiceAccount(t *testing.T) {
	env := kube.Env(t)
	ctx := context.Background()
	const node = "node-l5d"
	ns := env.TestNamespace(t)
	for _, sa := range []string{"meshagent", "web", "db"} {
		if _, err := env.CreateServiceAccount(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	grantNodeAgent(t, ns, "meshagent")
	pods := map[string]*corev1.Pod{}
	for _, p := range []struct{ name, sa, node string }{
		{"meshagent-node", "meshagent", node}, {"web-0", "web", node}, {"db-0", "db", node},
		{"db-far", "db", "node-other"},
	} {
		pod, err := env.CreatePod(ctx, ns, p.name, p.sa, p.node)
		if err != nil {
			t.Fatal(err)
		}
		pods[p.name] = pod
	}

	// Short-lived certificates make the agent renew while the test runs
	// (Linkerd's policy: at 70 % of the life, not before 10 s): every
	// renewal is a new CSR with a token.
	ca := linkerdca.Start(t, linkerdca.Config{
		TokenReviews: env.Client().AuthenticationV1().TokenReviews(),
		Lifetime:     20 * time.Second,
	})
	dir := agentproc.TempDir(t)
	tokenDir := filepath.Join(dir, "pod-tokens")
	if err := os.Mkdir(tokenDir, 0o700); err != nil {
		t.Fatal(err)
	}
	agentSA := "system:serviceaccount:" + ns + ":meshagent"
	if mayCreateTokens(t, agentSA, ns) {
		t.Fatalf("%s may create service-account tokens", agentSA)
	}
	apiTok, err := env.Token(ctx, ns, "meshagent", nil, pods["meshagent-node"], time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := env.Kubeconfig(kc, apiTok); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "trust-anchors.pem"), ca.RootPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	// The pods' volumes are published before the agent starts (the socket
	// directory the driver mounts into them is the agent's).
	socketDir := filepath.Join(dir, filepath.Dir(agentproc.SDSSocket))
	if err := os.MkdirAll(socketDir, 0o755); err != nil {
		t.Fatal(err)
	}
	kubelet := startCSI(t, node, socketDir, tokenDir)
	kubelet.publish(t, pods["web-0"])
	kubelet.publish(t, pods["db-0"])
	p := agentproc.Start(t, dir,
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", "MESHAGENT_LOG_LEVEL=debug",
		"MESHAGENT_MODE=node", "NODE_NAME="+node, "KUBECONFIG="+kc,
		"CA_PROVIDER=Linkerd", "CA_ADDR="+ca.Addr(), "CA_ROOT_CA="+filepath.Join(dir, "trust-anchors.pem"),
		"POD_NAMESPACE="+ns, "SERVICE_ACCOUNT=meshagent", "POD_NAME=meshagent-node",
		"MESHAGENT_TOKEN_LIFETIME=10m",
		"MESHAGENT_TOKEN_PATH="+filepath.Join(dir, "no-such-token"),
		"MESHAGENT_NODE_PREFETCH_ALL=true",
		"MESHAGENT_NODE_POD_TOKENS_DIR="+tokenDir,
	)

	web, db := linkerdca.Identity(ns, "web"), linkerdca.Identity(ns, "db")
	issued := func(id string) bool {
		for _, r := range ca.Requests() {
			if r.Identity == id && r.Code == 0 {
				return true
			}
		}
		return false
	}
	testwait.Within(t, 30*time.Second, "certificates fetched ahead for web and db", func() bool {
		return issued(web.DNSName) && issued(db.DNSName)
	})

	if got, want := fetchAsPod(t, p.Socket(), string(pods["web-0"].UID)), web.DNSName+" uris=0"; got != want {
		t.Errorf("web-0 got %q, want %q", got, want)
	}
	if got, want := fetchAsPod(t, p.Socket(), string(pods["db-0"].UID)), db.DNSName+" uris=0"; got != want {
		t.Errorf("db-0 got %q, want %q", got, want)
	}

	// Every CSR's token was its identity's own service account's, bound to
	// a pod of that account on the node, and was authenticated.
	checkReviews := func(wantPod map[string]string) {
		t.Helper()
		for _, r := range ca.Reviews() {
			ns2, sa, _ := strings.Cut(strings.TrimPrefix(r.Username, "system:serviceaccount:"), ":")
			if want := linkerdca.Identity(ns2, sa).DNSName; r.Identity != want {
				t.Errorf("CSR for %s carried a token of %s", r.Identity, r.Username)
			}
			if w, ok := wantPod[r.Identity]; ok && r.Authenticated && r.PodName != w {
				t.Errorf("token for %s bound to pod %q, want %q", r.Identity, r.PodName, w)
			}
		}
	}
	reviewed := func(id, pod string) bool {
		for _, r := range ca.Reviews() {
			if r.Identity == id && r.Authenticated && r.PodName == pod {
				return true
			}
		}
		return false
	}
	if !reviewed(web.DNSName, "web-0") || !reviewed(db.DNSName, "db-0") {
		t.Fatalf("reviews %+v, want web's token bound to web-0 and db's to db-0", ca.Reviews())
	}
	checkReviews(map[string]string{web.DNSName: "web-0", db.DNSName: "db-0"})
	for _, r := range ca.Reviews() {
		if r.Authenticated && r.PodUID != string(pods[r.PodName].UID) {
			t.Errorf("token bound to %s uid %s, want uid %s", r.PodName, r.PodUID, pods[r.PodName].UID)
		}
	}

	// web gets a second pod; web-0 goes. The next CSR for web (a renewal)
	// carries a token bound to web-1.
	web1, err := env.CreatePod(ctx, ns, "web-1", "web", node)
	if err != nil {
		t.Fatal(err)
	}
	pods["web-1"] = web1
	kubelet.publish(t, web1)
	kubelet.unpublish(t, pods["web-0"])
	if err := env.Client().CoreV1().Pods(ns).Delete(ctx, "web-0", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, 60*time.Second, "a CSR for web with a token bound to web-1", func() bool {
		return reviewed(web.DNSName, "web-1")
	})
	if got, want := fetchAsPod(t, p.Socket(), string(web1.UID)), web.DNSName+" uris=0"; got != want {
		t.Errorf("web-1 got %q, want %q", got, want)
	}
	checkReviews(nil)

	// One log format: client-go's lines (klog) come through the agent's
	// JSON logger too.
	p.Stop()
	for _, line := range strings.Split(strings.TrimSpace(p.Logs()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line not JSON: %q", line)
		}
	}
}

// mayCreateTokens asks the API server whether user may create a token of a
// service account of ns.
func mayCreateTokens(t *testing.T, user, ns string) bool {
	t.Helper()
	r, err := kube.Env(t).Client().AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: "create", Resource: "serviceaccounts", Subresource: "token", Name: "web",
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.Allowed
}

// csiKubelet is the kubelet's side of the node's CSI driver: the driver
// (internal/csi, with a token directory) serves its gRPC socket, and
// publish and unpublish call it as the kubelet does for a pod's inline
// volume of csi.meshagent.io.
type csiKubelet struct {
	node  csipb.NodeClient
	pods  string // the kubelet's pods directory
	token func(*corev1.Pod) (string, time.Time)
}

func startCSI(t *testing.T, node, socketDir, tokenDir string) *csiKubelet {
	t.Helper()
	root := t.TempDir()
	pods := filepath.Join(root, "pods")
	if err := os.Mkdir(pods, 0o750); err != nil {
		t.Fatal(err)
	}
	d, err := csi.NewDriver(csi.DriverConfig{NodeID: node, SocketDir: socketDir, TargetRoot: pods, TokenDir: tokenDir, TokenAudience: "identity.l5d.io"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := csi.NewServer(csi.ServerConfig{Driver: d, Endpoint: filepath.Join(root, "csi.sock"), RegistrationSocket: filepath.Join(root, "reg.sock")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("CSI server: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+filepath.Join(root, "csi.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	env := kube.Env(t)
	return &csiKubelet{node: csipb.NewNodeClient(conn), pods: pods, token: func(p *corev1.Pod) (string, time.Time) {
		// The kubelet's TokenRequest for the CSIDriver's audience, bound to
		// the pod.
		exp := int64(600)
		r, err := env.Client().CoreV1().ServiceAccounts(p.Namespace).CreateToken(context.Background(), p.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{
				Audiences: []string{"identity.l5d.io"}, ExpirationSeconds: &exp,
				BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.Token, r.Status.ExpirationTimestamp.Time
	}}
}

func (k *csiKubelet) target(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	parent := filepath.Join(k.pods, string(p.UID), "volumes", "kubernetes.io~csi", "mesh-socket")
	if err := os.MkdirAll(parent, 0o750); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(parent, "mount")
}

func (k *csiKubelet) publish(t *testing.T, p *corev1.Pod) {
	t.Helper()
	token, exp := k.token(p)
	tokens, err := json.Marshal(map[string]any{"identity.l5d.io": map[string]any{"token": token, "expirationTimestamp": exp.UTC().Format(time.RFC3339)}})
	if err != nil {
		t.Fatal(err)
	}
	target := k.target(t, p)
	if _, err := k.node.NodePublishVolume(context.Background(), &csipb.NodePublishVolumeRequest{
		VolumeId:   "csi-" + string(p.UID),
		TargetPath: target,
		VolumeCapability: &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
		Readonly: true,
		VolumeContext: map[string]string{
			"csi.storage.k8s.io/ephemeral":             "true",
			"csi.storage.k8s.io/pod.name":              p.Name,
			"csi.storage.k8s.io/pod.namespace":         p.Namespace,
			"csi.storage.k8s.io/pod.uid":               string(p.UID),
			"csi.storage.k8s.io/serviceAccount.name":   p.Spec.ServiceAccountName,
			"csi.storage.k8s.io/serviceAccount.tokens": string(tokens),
		},
	}); err != nil {
		t.Fatalf("NodePublishVolume for %s: %v", p.Name, err)
	}
	t.Cleanup(func() { k.unpublish(t, p) })
}

func (k *csiKubelet) unpublish(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := k.node.NodeUnpublishVolume(context.Background(), &csipb.NodeUnpublishVolumeRequest{
		VolumeId: "csi-" + string(p.UID), TargetPath: k.target(t, p),
	}); err != nil {
		t.Errorf("NodeUnpublishVolume for %s: %v", p.Name, err)
	}
}

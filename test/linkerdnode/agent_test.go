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

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
// agent with Linkerd: list and watch pods, create service-account tokens.
func grantNodeAgent(t *testing.T, ns, sa string) {
	t.Helper()
	ctx := context.Background()
	name := "meshagent-node-" + ns
	rbac := kube.Env(t).Client().RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, Verbs: []string{"create"}},
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
// identity protocol, two pods of different service accounts on the node.
// Each pod gets a certificate whose only name is its own Linkerd identity;
// the identity service saw each CSR with a token of that identity's own
// service account, bound to a pod of it on the node (its TokenReview log).
// After the pod the token was bound to is deleted, another pod of the same
// service account keeps the identity working: the next CSR carries a token
// bound to that pod.
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
	p := agentproc.Start(t, dir,
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", "MESHAGENT_LOG_LEVEL=debug",
		"MESHAGENT_MODE=node", "NODE_NAME="+node, "KUBECONFIG="+kc,
		"CA_PROVIDER=Linkerd", "CA_ADDR="+ca.Addr(), "CA_ROOT_CA="+filepath.Join(dir, "trust-anchors.pem"),
		"POD_NAMESPACE="+ns, "SERVICE_ACCOUNT=meshagent", "POD_NAME=meshagent-node",
		"MESHAGENT_TOKEN_LIFETIME=10m",
		"MESHAGENT_TOKEN_PATH="+filepath.Join(dir, "no-such-token"),
		"MESHAGENT_NODE_PREFETCH_ALL=true",
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

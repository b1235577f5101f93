package kubeenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/test/heavy"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// shared is the API server of the tests that need one.
var shared = &Shared{}

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

func TestToolsDirMatchesScript(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range []string{"", "/var/tmp/meshagent-tools", ".tools/kube"} {
		t.Run("MESHAGENT_TOOLS_DIR="+env, func(t *testing.T) {
			t.Setenv(ToolsDirEnv, env)
			out, err := exec.Command("bash", filepath.Join(root, "scripts", "tools.sh"), "-dir").Output()
			if err != nil {
				t.Fatalf("scripts/tools.sh -dir: %v", err)
			}
			dir, err := ToolsDir()
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(out)); got != dir {
				t.Fatalf("scripts/tools.sh builds into %s, ToolsDir() looks in %s", got, dir)
			}
		})
	}
}

func TestToolPathMissingSaysRunMakeTools(t *testing.T) {
	t.Setenv(ToolsDirEnv, t.TempDir())
	_, err := ToolPath("kube-apiserver")
	if err == nil || !strings.Contains(err.Error(), "run make tools") {
		t.Fatalf("ToolPath of a missing tool: err = %v, want one saying run make tools", err)
	}
	if _, err := Start(context.Background(), Options{}); err == nil || !strings.Contains(err.Error(), "run make tools") {
		t.Fatalf("Start without tools: err = %v, want one saying run make tools", err)
	}
}

func TestStartNamesTheProcessThatFailed(t *testing.T) {
	heavy.Skip(t, "starts etcd")
	_, err := Start(context.Background(), Options{APIServerFlags: []string{"--no-such-flag"}})
	if err == nil {
		t.Fatal("Start with an unknown API server flag succeeded")
	}
	for _, want := range []string{"kube-apiserver exited", "no-such-flag"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q:\n%v", want, err)
		}
	}
}

func TestPodBoundTokenReview(t *testing.T) {
	kube := shared.Env(t)
	ctx := context.Background()
	ns := newNamespace(t)
	if _, err := kube.CreateServiceAccount(ctx, ns, "app"); err != nil {
		t.Fatal(err)
	}
	pod, err := kube.CreatePod(ctx, ns, "app-0", "app", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if pod.UID == "" || pod.Spec.NodeName != "node-a" {
		t.Fatalf("stored pod: uid %q node %q", pod.UID, pod.Spec.NodeName)
	}
	token, err := kube.Token(ctx, ns, "app", []string{"istio-ca"}, pod, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	status := review(t, token, "istio-ca")
	if !status.Authenticated {
		t.Fatalf("token not authenticated: %q", status.Error)
	}
	if want := "system:serviceaccount:" + ns + ":app"; status.User.Username != want {
		t.Errorf("username %q, want %q", status.User.Username, want)
	}
	if !slices.Contains(status.Audiences, "istio-ca") {
		t.Errorf("audiences %v, want istio-ca", status.Audiences)
	}
	for key, want := range map[string]string{
		"authentication.kubernetes.io/pod-name":  pod.Name,
		"authentication.kubernetes.io/pod-uid":   string(pod.UID),
		"authentication.kubernetes.io/node-name": "node-a",
	} {
		if got := status.User.Extra[key]; len(got) != 1 || got[0] != want {
			t.Errorf("extra %s = %v, want [%s]", key, got, want)
		}
	}

	// The same token for another audience is refused: the review checks audiences.
	if other := review(t, token, "identity.l5d.io"); other.Authenticated {
		t.Errorf("token for istio-ca authenticated for identity.l5d.io")
	}
}

func TestRestartKeepsObjectsAndTokens(t *testing.T) {
	kube := shared.Env(t)
	ctx := context.Background()
	ns := newNamespace(t)
	if _, err := kube.CreateServiceAccount(ctx, ns, "app"); err != nil {
		t.Fatal(err)
	}
	pod, err := kube.CreatePod(ctx, ns, "app-0", "app", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	token, err := kube.Token(ctx, ns, "app", []string{"istio-ca"}, pod, 0)
	if err != nil {
		t.Fatal(err)
	}
	host := kube.Host()

	if err := kube.Restart(ctx); err != nil {
		t.Fatal(err)
	}

	if kube.Host() != host {
		t.Errorf("host changed across restart: %s -> %s", host, kube.Host())
	}
	got, err := kube.Client().CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pod after restart: %v", err)
	}
	if got.UID != pod.UID {
		t.Errorf("pod UID after restart %s, want %s", got.UID, pod.UID)
	}
	if status := review(t, token, "istio-ca"); !status.Authenticated {
		t.Errorf("token issued before the restart refused after it: %q", status.Error)
	}
}

func TestKubeconfigForServiceAccount(t *testing.T) {
	kube := shared.Env(t)
	ctx := context.Background()
	ns := newNamespace(t)
	if _, err := kube.CreateServiceAccount(ctx, ns, "reader"); err != nil {
		t.Fatal(err)
	}
	token, err := kube.Token(ctx, ns, "reader", nil, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kube.Kubeconfig(path, token); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig file: %v, mode %v", err, info.Mode())
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	who, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "system:serviceaccount:" + ns + ":reader"; who.Status.UserInfo.Username != want {
		t.Errorf("kubeconfig authenticates as %q, want %q", who.Status.UserInfo.Username, want)
	}
	// RBAC is on: a service account with no role binding may not list pods.
	_, err = client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("listing pods without a role: err = %v, want Forbidden", err)
	}
}

// newNamespace creates a namespace named after the test, deleted when it ends.
func newNamespace(t *testing.T) string {
	t.Helper()
	return shared.Env(t).TestNamespace(t)
}

func review(t *testing.T, token, audience string) authenticationv1.TokenReviewStatus {
	t.Helper()
	kube := shared.Env(t)
	r, err := kube.Client().AuthenticationV1().TokenReviews().Create(context.Background(), &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenReview: %v", err)
	}
	return r.Status
}

// BenchmarkStart measures what one package's API server costs a test run once the
// tools are built: start to /readyz (etcd first), and stop.
//
//	go test -run '^$' -bench Start -benchtime 5x ./test/kubeenv
func BenchmarkStart(b *testing.B) {
	var ready, stop time.Duration
	for b.Loop() {
		t0 := time.Now()
		env, err := Start(context.Background(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := env.Stop(); err != nil {
			b.Fatal(err)
		}
		ready += t1.Sub(t0)
		stop += time.Since(t1)
	}
	b.ReportMetric(ready.Seconds()/float64(b.N), "s-to-ready/op")
	b.ReportMetric(stop.Seconds()/float64(b.N), "s-to-stop/op")
}

// TestRestartWithOpenWatch: a client watching pods (an informer) does not
// hold up a restart; the watch ends and a new one works afterwards.
func TestRestartWithOpenWatch(t *testing.T) {
	kube := shared.Env(t)
	ctx := context.Background()
	ns := newNamespace(t)
	w, err := kube.Client().CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := kube.Restart(ctx); err != nil {
		t.Fatalf("restart with an open watch: %v", err)
	}
	for range w.ResultChan() { // ended by the server's shutdown
	}
	w2, err := kube.Client().CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watch after the restart: %v", err)
	}
	w2.Stop()
}

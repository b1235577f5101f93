package credfetcher

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/kubeenv"
)

// workload is a namespace with a service account allowed to create tokens
// for itself only, a pod running as it, and a client that acts as it.
type workload struct {
	env    *kubeenv.Env
	ns, sa string
	pod    *corev1.Pod
	client *kubeclient.Client // authenticated as the service account
}

func newWorkload(t *testing.T, node string) *workload {
	t.Helper()
	env := kube.Env(t)
	ctx := context.Background()
	ns := env.TestNamespace(t)
	const sa = "web"
	if _, err := env.CreateServiceAccount(ctx, ns, sa); err != nil {
		t.Fatal(err)
	}
	grantOwnTokens(t, env.Client(), ns, sa)
	pod, err := env.CreatePod(ctx, ns, "web-0", sa, node)
	if err != nil {
		t.Fatal(err)
	}
	// The account's credentials for the API itself (default audience).
	tok, err := env.Token(ctx, ns, sa, nil, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubeclient.NewForConfig(env.ConfigForToken(tok))
	if err != nil {
		t.Fatal(err)
	}
	return &workload{env: env, ns: ns, sa: sa, pod: pod, client: client}
}

// grantOwnTokens lets ns/sa create tokens for itself and nothing else: the
// RBAC an agent using TokenRequest needs.
func grantOwnTokens(t *testing.T, admin kubernetes.Interface, ns, sa string) {
	t.Helper()
	ctx := context.Background()
	name := sa + "-own-tokens"
	_, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"},
			Verbs: []string{"create"}, ResourceNames: []string{sa},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func (w *workload) fetcher(t *testing.T, client TokenCreator, clk *clocktesting.FakeClock, log *zap.Logger) *TokenRequest {
	t.Helper()
	f, err := NewTokenRequest(TokenRequestConfig{
		Client: client, Namespace: w.ns, ServiceAccount: w.sa,
		PodName: w.pod.Name, PodUID: w.pod.UID, Audiences: []string{pki.IstioAudience},
		Lifetime: MinTokenLifetime, Clock: clk, Logger: log,
		RefreshRatio: 0.8,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// review asks the API server, as a CA would, what tok is.
func (w *workload) review(t *testing.T, tok string, audiences ...string) authnv1.TokenReviewStatus {
	t.Helper()
	tr, err := w.env.Client().AuthenticationV1().TokenReviews().Create(context.Background(),
		&authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: tok, Audiences: audiences}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status
}

func (w *workload) checkBound(t *testing.T, tok string) {
	t.Helper()
	st := w.review(t, tok, pki.IstioAudience)
	if !st.Authenticated {
		t.Fatalf("token not authenticated for %s: %s", pki.IstioAudience, st.Error)
	}
	if want := "system:serviceaccount:" + w.ns + ":" + w.sa; st.User.Username != want {
		t.Errorf("user %q, want %q", st.User.Username, want)
	}
	extra := st.User.Extra
	if got := extra["authentication.kubernetes.io/pod-name"]; len(got) != 1 || got[0] != w.pod.Name {
		t.Errorf("pod-name %v, want %s", got, w.pod.Name)
	}
	if got := extra["authentication.kubernetes.io/pod-uid"]; len(got) != 1 || got[0] != string(w.pod.UID) {
		t.Errorf("pod-uid %v, want %s", got, w.pod.UID)
	}
	if st := w.review(t, tok, "some-other-audience"); st.Authenticated {
		t.Error("the token is also valid for another audience")
	}
}

func TestTokenRequestFromTheAPIServer(t *testing.T) {
	w := newWorkload(t, "node-a")
	clk := clocktesting.NewFakeClock(time.Now())
	f := w.fetcher(t, w.client, clk, nil)

	// Concurrent first callers share one request: they all get one token.
	const n = 8
	toks := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok, err := f.Token(context.Background())
			if err != nil {
				t.Error(err)
			}
			toks[i] = tok
		}()
	}
	wg.Wait()
	first := toks[0]
	for _, tok := range toks {
		if tok != first {
			t.Fatal("concurrent callers got different tokens")
		}
	}
	w.checkBound(t, first)
	start := clk.Now()
	f.mu.Lock()
	life, refreshAt := f.expiry.Sub(start), f.refreshAt
	f.mu.Unlock()
	if life < MinTokenLifetime-time.Minute || life > MinTokenLifetime+time.Minute {
		t.Errorf("token lives %s, asked for %s", life, MinTokenLifetime)
	}
	// The API server's expiry has whole seconds and its clock ran on while
	// the fake one stood still: 80 % of the life it gave, within 2 s.
	if due := refreshAt.Sub(start); due < 8*time.Minute-2*time.Second || due > 8*time.Minute+2*time.Second {
		t.Errorf("token due for refresh after %s, want 80 %% of %s", due, MinTokenLifetime)
	}

	// Reused until 80 % of its life, replaced after.
	clk.SetTime(refreshAt.Add(-2 * time.Second))
	if got := mustToken(t, f); got != first {
		t.Fatal("token replaced before 80 % of its life")
	}
	clk.SetTime(refreshAt)
	second := mustToken(t, f)
	if second == first {
		t.Fatal("token not replaced at 80 % of its life")
	}
	w.checkBound(t, second)

	// Refused by a peer: replaced at once.
	f.Invalidate(second)
	third := mustToken(t, f)
	if third == second {
		t.Fatal("a refused token was handed out again")
	}
	w.checkBound(t, third)
}

func TestTokenRequestForAnotherPodUIDIsRefused(t *testing.T) {
	w := newWorkload(t, "node-a")
	f, err := NewTokenRequest(TokenRequestConfig{
		Client: w.client, Namespace: w.ns, ServiceAccount: w.sa,
		PodName: w.pod.Name, PodUID: "00000000-0000-0000-0000-000000000000", Audiences: []string{pki.IstioAudience},
		Lifetime: time.Hour, RefreshRatio: 0.8,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Token(context.Background())
	if err == nil || !strings.Contains(err.Error(), "requesting a token for serviceaccount "+w.ns+"/web: ") || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("token for a pod with another UID: %v", err)
	}
}

func TestTokenRequestWithoutRBACIsForbidden(t *testing.T) {
	w := newWorkload(t, "node-a")
	ctx := context.Background()
	// Another account of the namespace, not allowed to create tokens.
	if _, err := w.env.CreateServiceAccount(ctx, w.ns, "other"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.env.CreatePod(ctx, w.ns, "other-0", "other", "node-a"); err != nil {
		t.Fatal(err)
	}
	f, err := NewTokenRequest(TokenRequestConfig{
		Client: w.client, Namespace: w.ns, ServiceAccount: "other",
		PodName: "other-0", Audiences: []string{pki.IstioAudience},
		Lifetime: time.Hour, RefreshRatio: 0.8,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Token(ctx)
	if err == nil || !strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), "serviceaccounts/token") {
		t.Fatalf("token for another account: %v", err)
	}
}

func TestTokenRequestDeletedServiceAccount(t *testing.T) {
	w := newWorkload(t, "node-a")
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Now())
	core, logs := observer.New(zap.InfoLevel)
	// Two views: the account itself (its credentials die with it) and an
	// operator's client that outlives it.
	own := w.fetcher(t, w.client, clk, zap.New(core))
	adminClient, err := kubeclient.NewForConfig(w.env.Config())
	if err != nil {
		t.Fatal(err)
	}
	admin := w.fetcher(t, adminClient, clk, nil)
	ownTok, adminTok := mustToken(t, own), mustToken(t, admin)

	if err := w.env.Client().CoreV1().ServiceAccounts(w.ns).Delete(ctx, w.sa, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server caches token authentications for a few seconds, so
	// the deletion reaches TokenReview after a while; bounded.
	testwait.Within(t, 15*time.Second, "the token of the deleted service account to stop authenticating", func() bool {
		return !w.review(t, ownTok, pki.IstioAudience).Authenticated
	})
	admin.Invalidate(adminTok)
	_, err = admin.Token(ctx)
	want := `requesting a token for serviceaccount ` + w.ns + `/web: serviceaccounts "web" not found`
	if err == nil || err.Error() != want {
		t.Fatalf("error %v\nwant %s", err, want)
	}

	// The account's own credentials die with it, but the API server may
	// still accept them for a few seconds from its authentication cache:
	// the request then fails on the missing account instead.
	own.Invalidate(ownTok)
	_, err = own.Token(ctx)
	if err == nil || (err.Error() != want && !strings.HasPrefix(err.Error(), "requesting a token for serviceaccount "+w.ns+"/web: the API server refused the agent's own credentials")) {
		t.Fatalf("error %v", err)
	}
	if logs.FilterMessage("token request failed; no valid token").Len() != 1 {
		t.Errorf("log lines %v", logs.All())
	}
}

func TestTokenRequestAcrossAnAPIServerRestart(t *testing.T) {
	w := newWorkload(t, "node-a")
	clk := clocktesting.NewFakeClock(time.Now())
	f := w.fetcher(t, w.client, clk, nil)
	first := mustToken(t, f)
	if err := w.env.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The cached token needs no API server; the next one comes from the
	// restarted server, and the old one is still valid there.
	if got := mustToken(t, f); got != first {
		t.Fatal("token changed across the restart")
	}
	clk.Step(8 * time.Minute)
	second := mustToken(t, f)
	if second == first {
		t.Fatal("no new token after the restart")
	}
	w.checkBound(t, first)
	w.checkBound(t, second)
}

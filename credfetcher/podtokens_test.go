package credfetcher

import (
	"context"
	"errors"
	"sync"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/pki"
)

// podList is a PodLister a test edits.
type podList struct {
	mu   sync.Mutex
	pods map[string][]PodRef // by "ns/sa"
}

func (l *podList) PodsOf(ns, sa string) []PodRef {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]PodRef(nil), l.pods[ns+"/"+sa]...)
}

func (l *podList) set(key string, pods ...*corev1.Pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var refs []PodRef
	for _, p := range pods {
		refs = append(refs, PodRef{Name: p.Name, UID: p.UID})
	}
	l.pods[key] = refs
}

// review asks the API server who tok is: the service account and the pod
// it is bound to.
func review(t *testing.T, w *workload, tok string) (user, pod, uid string) {
	t.Helper()
	r, err := w.env.Client().AuthenticationV1().TokenReviews().Create(context.Background(), &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: tok, Audiences: []string{pki.LinkerdAudience}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Status.Authenticated {
		t.Fatalf("token not authenticated: %s", r.Status.Error)
	}
	first := func(k string) string {
		if v := r.Status.User.Extra[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	return r.Status.User.Username, first("authentication.kubernetes.io/pod-name"), first("authentication.kubernetes.io/pod-uid")
}

// TestPodTokensPerAccount: each service account's tokens are its own and
// bound to one of its listed pods; when that pod is no longer listed the
// next token is bound to another; with none left, ErrNoPod.
func TestPodTokensPerAccount(t *testing.T) {
	w := newWorkload(t, "node-a")
	ctx := context.Background()
	if _, err := w.env.CreateServiceAccount(ctx, w.ns, "db"); err != nil {
		t.Fatal(err)
	}
	web1, err := w.env.CreatePod(ctx, w.ns, "web-1", "web", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	db0, err := w.env.CreatePod(ctx, w.ns, "db-0", "db", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	pods := &podList{pods: map[string][]PodRef{}}
	pods.set(w.ns+"/web", w.pod, web1)
	pods.set(w.ns+"/db", db0)
	admin, err := kubeclient.NewForConfig(w.env.Config())
	if err != nil {
		t.Fatal(err)
	}
	pt, err := NewPodTokens(PodTokensConfig{Client: admin, Pods: pods, Audiences: []string{pki.LinkerdAudience}})
	if err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		t.Helper()
		f, err := pt.For(w.ns, sa)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := f.Token(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}

	webTok := token("web")
	if u, pod, uid := review(t, w, webTok); u != "system:serviceaccount:"+w.ns+":web" || pod != "web-0" || uid != string(w.pod.UID) {
		t.Fatalf("web token: user %s pod %s uid %s, want web bound to web-0 %s", u, pod, uid, w.pod.UID)
	}
	if u, pod, _ := review(t, w, token("db")); u != "system:serviceaccount:"+w.ns+":db" || pod != "db-0" {
		t.Fatalf("db token: user %s pod %s, want db bound to db-0", u, pod)
	}
	if again := token("web"); again != webTok {
		t.Fatal("a second For made a new token while the pod is listed")
	}

	// web-0 leaves: the next token is bound to web-1.
	if err := w.env.Client().CoreV1().Pods(w.ns).Delete(ctx, "web-0", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	pods.set(w.ns+"/web", web1)
	if u, pod, uid := review(t, w, token("web")); u != "system:serviceaccount:"+w.ns+":web" || pod != "web-1" || uid != string(web1.UID) {
		t.Fatalf("web token after web-0 left: user %s pod %s uid %s, want bound to web-1", u, pod, uid)
	}

	// No pod left: no token, and the account is forgotten.
	pods.set(w.ns + "/web")
	if _, err := pt.For(w.ns, "web"); !errors.Is(err, ErrNoPod) {
		t.Fatalf("For with no pod: %v, want ErrNoPod", err)
	}
	if accounts(pt) != 1 {
		t.Fatalf("%d accounts kept, want 1 (db)", accounts(pt))
	}
	pt.Drop(w.ns, "db")
	if accounts(pt) != 0 {
		t.Fatalf("%d accounts kept after Drop, want 0", accounts(pt))
	}
}

func TestNewPodTokensChecks(t *testing.T) {
	if _, err := NewPodTokens(PodTokensConfig{Audiences: []string{"a"}}); err == nil {
		t.Error("no pod lister accepted")
	}
	if _, err := NewPodTokens(PodTokensConfig{Pods: &podList{}, Audiences: []string{"a"}}); err == nil {
		t.Error("no client accepted")
	}
}

// accounts returns the number of accounts with a fetcher.
func accounts(p *PodTokens) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byAcc)
}

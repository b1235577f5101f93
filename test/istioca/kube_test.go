package istioca

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	pb "istio.io/api/security/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/kubeenv"
)

// cluster is one test's namespaces in the shared API server: a node agent
// (istio-system-like namespace, service account "ztunnel", pod on node-a)
// and a workload namespace.
type cluster struct {
	env      *kubeenv.Env
	sys, app string
	agentPod *corev1.Pod
	agentSA  ServiceAccount
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	env := kube.Env(t)
	ctx := context.Background()
	base := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(base) > 40 {
		base = base[:40]
	}
	base = strings.Trim(base, "-") + "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) // -count=2
	c := &cluster{env: env, sys: base + "-sys", app: base + "-app"}
	for _, ns := range []string{c.sys, c.app} {
		if _, err := env.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	c.agentSA = ServiceAccount{Namespace: c.sys, Name: "ztunnel"}
	if _, err := env.CreateServiceAccount(ctx, c.sys, "ztunnel"); err != nil {
		t.Fatal(err)
	}
	pod, err := env.CreatePod(ctx, c.sys, "ztunnel-a", "ztunnel", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	c.agentPod = pod
	return c
}

func (c *cluster) pod(t *testing.T, ns, name, sa, node string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	if _, err := c.env.Client().CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{}); err != nil {
		if _, err := c.env.CreateServiceAccount(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	p, err := c.env.CreatePod(ctx, ns, name, sa, node)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (c *cluster) token(t *testing.T, ns, sa string, aud []string, pod *corev1.Pod) string {
	t.Helper()
	tok, err := c.env.Token(context.Background(), ns, sa, aud, pod, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// deleteNow removes a pod at once, as a kubelet would once its containers
// stopped: without a kubelet a pod on a node would otherwise wait out its
// grace period, and tokens bound to it stay valid meanwhile.
var deleteNow = metav1.DeleteOptions{GracePeriodSeconds: new(int64)}

func csrFor(t *testing.T, id pki.Identity) string {
	t.Helper()
	der, err := pki.NewCSR(newKey(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return string(pki.EncodeCSRPEM(der))
}

func TestTokenReviewAuthentication(t *testing.T) {
	c := newCluster(t)
	web := c.pod(t, c.app, "web-0", "web", "node-a")
	webSA := ServiceAccount{Namespace: c.app, Name: "web"}
	s := start(t, Config{Kube: c.env.Client()})
	bound := c.token(t, c.app, "web", []string{"istio-ca"}, web)
	gone := c.pod(t, c.app, "gone-0", "web", "node-a")
	goneTok := c.token(t, c.app, "web", []string{"istio-ca"}, gone)
	if err := c.env.Client().CoreV1().Pods(c.app).Delete(context.Background(), "gone-0", deleteNow); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		token string
		code  codes.Code
	}{
		{"pod-bound token, audience istio-ca", bound, codes.OK},
		{"unbound token, audience istio-ca", c.token(t, c.app, "web", []string{"istio-ca"}, nil), codes.OK},
		{"token for the API server's audience", c.token(t, c.app, "web", nil, web), codes.Unauthenticated},
		{"token for another audience", c.token(t, c.app, "web", []string{"identity.l5d.io"}, web), codes.Unauthenticated},
		{"token of a deleted pod", goneTok, codes.Unauthenticated},
		{"not a token", "garbage", codes.Unauthenticated},
		{"the token table still works", token, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := s.Identity(webSA)
			if tt.token == token {
				id = s.Identity(sa)
			}
			resp, err := client(t, s, nil).CreateCertificate(withToken(t, tt.token), &pb.IstioCertificateRequest{Csr: csrFor(t, id)})
			if code := status.Code(err); code != tt.code {
				t.Fatalf("code %s (%v), want %s", code, err, tt.code)
			}
			if err == nil {
				if got, _ := pki.IdentityOf(parse(t, resp)[0]); got != id {
					t.Errorf("issued for %s, want %s", got, id)
				}
			}
		})
	}

	// What the review of the pod-bound token said.
	var r *Review
	for _, rv := range s.Reviews() {
		if rv.Token == bound {
			r = &rv
		}
	}
	if r == nil {
		t.Fatal("the pod-bound token was not reviewed")
	}
	if !r.Authenticated || r.ServiceAccount != webSA || r.PodName != "web-0" || r.PodUID != string(web.UID) || r.NodeName != "node-a" {
		t.Errorf("review %+v", *r)
	}
	if len(r.Audiences) != 1 || r.Audiences[0] != "istio-ca" {
		t.Errorf("audiences %v", r.Audiences)
	}
	if life := r.Expiry.Sub(r.IssuedAt); life != 10*time.Minute {
		t.Errorf("token life %s, want 10m", life)
	}
}

func TestTokenReviewAudienceIsConfigurable(t *testing.T) {
	c := newCluster(t)
	web := c.pod(t, c.app, "web-0", "web", "node-a")
	s := start(t, Config{Kube: c.env.Client(), Audiences: []string{"my-mesh"}})
	id := s.Identity(ServiceAccount{Namespace: c.app, Name: "web"})
	for aud, want := range map[string]codes.Code{"my-mesh": codes.OK, "istio-ca": codes.Unauthenticated} {
		tok := c.token(t, c.app, "web", []string{aud}, web)
		_, err := client(t, s, nil).CreateCertificate(withToken(t, tok), &pb.IstioCertificateRequest{Csr: csrFor(t, id)})
		if status.Code(err) != want {
			t.Errorf("audience %s: %v, want %s", aud, err, want)
		}
	}
}

func impersonating(t *testing.T, id pki.Identity) *structpb.Struct {
	t.Helper()
	return &structpb.Struct{Fields: map[string]*structpb.Value{ImpersonatedIdentityKey: structpb.NewStringValue(id.String())}}
}

func TestImpersonation(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	c.pod(t, c.app, "web-a", "web", "node-a")
	c.pod(t, c.app, "db-b", "db", "node-b")
	failed := c.pod(t, c.app, "batch-a", "batch", "node-a")
	failed.Status.Phase = corev1.PodFailed
	if _, err := c.env.Client().CoreV1().Pods(c.app).UpdateStatus(ctx, failed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A second node agent, on node-b, and an untrusted account on node-a.
	agentB := c.pod(t, c.sys, "ztunnel-b", "ztunnel", "node-b")
	rogue := c.pod(t, c.sys, "rogue-a", "rogue", "node-a")

	s := start(t, Config{Kube: c.env.Client(), TrustedNodeAccounts: []ServiceAccount{c.agentSA}})
	agentTok := c.token(t, c.sys, "ztunnel", []string{"istio-ca"}, c.agentPod)
	agentBTok := c.token(t, c.sys, "ztunnel", []string{"istio-ca"}, agentB)
	unboundTok := c.token(t, c.sys, "ztunnel", []string{"istio-ca"}, nil)
	rogueTok := c.token(t, c.sys, "rogue", []string{"istio-ca"}, rogue)
	app := func(name string) pki.Identity { return s.Identity(ServiceAccount{Namespace: c.app, Name: name}) }

	tests := []struct {
		name   string
		token  string
		want   pki.Identity
		ok     bool
		reason string
	}{
		{"trusted agent, pod of the account on its node", agentTok, app("web"), true, ""},
		{"trusted agent, the account's pod is on another node", agentTok, app("db"), false, "no pod of " + c.app + "/db runs on node node-a"},
		{"trusted agent on the other node", agentBTok, app("db"), true, ""},
		{"only a failed pod of the account on the node", agentTok, app("batch"), false, "no pod of " + c.app + "/batch runs on node node-a"},
		{"no such account", agentTok, app("nobody"), false, "no pod of " + c.app + "/nobody runs on node node-a"},
		{"untrusted account", rogueTok, app("web"), false, "caller " + c.sys + "/rogue is not a trusted node account"},
		{"token not bound to a pod", unboundTok, app("web"), false, "caller's token is not bound to a pod"},
		{"another trust domain", agentTok, pki.SPIFFEIdentity("elsewhere.org", c.app, "web"), false, "is not a service account of trust domain cluster.local"},
		{"token table caller", token, app("web"), false, "impersonation needs a caller authenticated by TokenReview"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(s.Denials())
			resp, err := client(t, s, nil).CreateCertificate(withToken(t, tt.token), &pb.IstioCertificateRequest{
				Csr: csrFor(t, tt.want), Metadata: impersonating(t, tt.want),
			})
			if tt.ok {
				if err != nil {
					t.Fatalf("refused: %v (denials %v)", err, s.Denials()[before:])
				}
				if got, _ := pki.IdentityOf(parse(t, resp)[0]); got != tt.want {
					t.Errorf("issued for %s, want %s", got, tt.want)
				}
				return
			}
			if status.Code(err) != codes.Unauthenticated || status.Convert(err).Message() != errDenied {
				t.Fatalf("answer %v, want Unauthenticated %q", err, errDenied)
			}
			d := s.Denials()[before:]
			if len(d) != 1 || !strings.Contains(d[0], tt.reason) {
				t.Errorf("denials %v, want one with %q", d, tt.reason)
			}
		})
	}

	t.Run("caller pod deleted", func(t *testing.T) {
		gone := c.pod(t, c.sys, "ztunnel-gone", "ztunnel", "node-a")
		tok := c.token(t, c.sys, "ztunnel", []string{"istio-ca"}, gone)
		if err := c.env.Client().CoreV1().Pods(c.sys).Delete(ctx, gone.Name, deleteNow); err != nil {
			t.Fatal(err)
		}
		_, err := client(t, s, nil).CreateCertificate(withToken(t, tok), &pb.IstioCertificateRequest{
			Csr: csrFor(t, app("web")), Metadata: impersonating(t, app("web")),
		})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("answer %v, want Unauthenticated", err)
		}
	})
}

// TestImpersonationFromPodCache: the node authorizer answers from its pod
// informer, asking the API server only for what the informer has not seen.
func TestImpersonationFromPodCache(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	s := start(t, Config{Kube: c.env.Client(), TrustedNodeAccounts: []ServiceAccount{c.agentSA}})
	agentTok := c.token(t, c.sys, "ztunnel", []string{"istio-ca"}, c.agentPod)
	web := s.Identity(ServiceAccount{Namespace: c.app, Name: "web"})
	ask := func(t *testing.T, tok string, id pki.Identity) error {
		t.Helper()
		_, err := client(t, s, nil).CreateCertificate(withToken(t, tok), &pb.IstioCertificateRequest{
			Csr: csrFor(t, id), Metadata: impersonating(t, id),
		})
		return err
	}
	cached := func(ns, name string) func() bool {
		return func() bool { return s.pods.pod(ns, name) != nil }
	}

	// The agent's pod was in the informer's first list.
	if s.pods.pod(c.sys, c.agentPod.Name) == nil {
		t.Fatalf("the caller's pod %s/%s is not in the cache Start waited for", c.sys, c.agentPod.Name)
	}

	t.Run("pod added: allowed from the cache", func(t *testing.T) {
		c.pod(t, c.app, "web-0", "web", "node-a")
		testwait.Within(t, 30*time.Second, "the informer sees web-0", cached(c.app, "web-0"))
		misses := s.PodCacheMisses()
		if err := ask(t, agentTok, web); err != nil {
			t.Fatalf("refused: %v (denials %v)", err, s.Denials())
		}
		if got := s.PodCacheMisses() - misses; got != 0 {
			t.Errorf("%d cache misses, want none: the cache holds both pods", got)
		}
	})

	t.Run("pod failed: refused once the informer sees it", func(t *testing.T) {
		p, err := c.env.Client().CoreV1().Pods(c.app).Get(ctx, "web-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = corev1.PodFailed
		if _, err := c.env.Client().CoreV1().Pods(c.app).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Within(t, 30*time.Second, "the informer sees web-0 failed", func() bool {
			p := s.pods.pod(c.app, "web-0")
			return p != nil && p.Status.Phase == corev1.PodFailed
		})
		before, reads := len(s.Denials()), s.PodReads()
		if err := ask(t, agentTok, web); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("answer %v, want Unauthenticated", err)
		}
		if d := s.Denials()[before:]; len(d) != 1 || !strings.Contains(d[0], "no pod of "+c.app+"/web runs on node node-a") {
			t.Errorf("denials %v", d)
		}
		// The miss is confirmed, after the wait, by one List, which finds
		// the failed pod only.
		if got := s.PodReads() - reads; got != 1 {
			t.Errorf("%d API server reads, want 1", got)
		}
	})

	t.Run("pod deleted: refused once the informer sees it", func(t *testing.T) {
		c.pod(t, c.app, "web-1", "web", "node-a")
		testwait.Within(t, 30*time.Second, "the informer sees web-1", cached(c.app, "web-1"))
		if err := ask(t, agentTok, web); err != nil {
			t.Fatalf("refused while web-1 runs: %v (denials %v)", err, s.Denials())
		}
		if err := c.env.Client().CoreV1().Pods(c.app).Delete(ctx, "web-1", deleteNow); err != nil {
			t.Fatal(err)
		}
		testwait.Within(t, 30*time.Second, "the informer sees web-1 deleted", func() bool { return !cached(c.app, "web-1")() })
		before := len(s.Denials())
		if err := ask(t, agentTok, web); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("answer %v, want Unauthenticated", err)
		}
		if d := s.Denials()[before:]; len(d) != 1 || !strings.Contains(d[0], "no pod of "+c.app+"/web runs on node node-a") {
			t.Errorf("denials %v", d)
		}
	})

	t.Run("pod created while its CSR waits for the informer", func(t *testing.T) {
		// A CA that waits long: the pod is created only once the CSR is
		// known to wait for it.
		w := start(t, Config{Kube: c.env.Client(), TrustedNodeAccounts: []ServiceAccount{c.agentSA}, PodCacheWait: time.Minute})
		late := w.Identity(ServiceAccount{Namespace: c.app, Name: "late"})
		cc, ctx, req := client(t, w, nil), withToken(t, agentTok), &pb.IstioCertificateRequest{Csr: csrFor(t, late), Metadata: impersonating(t, late)}
		errc := make(chan error, 1)
		go func() {
			_, err := cc.CreateCertificate(ctx, req)
			errc <- err
		}()
		testwait.Within(t, 30*time.Second, "the CSR misses the cache", func() bool { return w.PodCacheMisses() == 1 })
		c.pod(t, c.app, "late-0", "late", "node-a")
		if err := <-errc; err != nil {
			t.Fatalf("refused: %v (denials %v)", err, w.Denials())
		}
		if misses, reads := w.PodCacheMisses(), w.PodReads(); misses != 1 || reads != 0 {
			t.Errorf("%d misses, %d API server reads; want 1 and none: the informer brought the pod", misses, reads)
		}
	})

	t.Run("pods the informer has not seen: one read each", func(t *testing.T) {
		// With the informer stopped, new pods never reach the cache: what
		// a CSR finds when it arrives before the watch event.
		s.pods.stop()
		agentC := c.pod(t, c.sys, "ztunnel-c", "ztunnel", "node-c")
		c.pod(t, c.app, "api-c", "api", "node-c")
		tok := c.token(t, c.sys, "ztunnel", []string{"istio-ca"}, agentC)
		if cached(c.sys, "ztunnel-c")() || cached(c.app, "api-c")() {
			t.Fatal("a stopped informer cached a new pod")
		}
		misses, reads := s.PodCacheMisses(), s.PodReads()
		if err := ask(t, tok, s.Identity(ServiceAccount{Namespace: c.app, Name: "api"})); err != nil {
			t.Fatalf("refused: %v (denials %v)", err, s.Denials())
		}
		if m, r := s.PodCacheMisses()-misses, s.PodReads()-reads; m != 2 || r != 2 {
			t.Errorf("%d misses, %d API server reads; want 2 of each (a Get of the caller's pod, a List of the node's pods)", m, r)
		}
		// Still the same rules: nothing of the account runs on node-c.
		before := len(s.Denials())
		if err := ask(t, tok, web); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("answer %v, want Unauthenticated", err)
		}
		if d := s.Denials()[before:]; len(d) != 1 || !strings.Contains(d[0], "no pod of "+c.app+"/web runs on node node-c") {
			t.Errorf("denials %v", d)
		}
	})
}

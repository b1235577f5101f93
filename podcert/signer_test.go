package podcert

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	certsv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/caclient/istio"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/istioca"
)

func ecKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// A request for a pod of the agent's node is issued for the pod's SPIFFE
// ID and the request's key, asked of the CA on the pod's behalf; a request
// of another node's kubelet is never touched; nothing is published.
func TestIssuesForPodsOfItsNodeOnly(t *testing.T) {
	c := newCluster(t, istioca.Config{})
	c.startSigner(nil)

	// Another node's request first: by the time the later one of the
	// agent's node is answered, this one has been listed too, if it ever
	// were.
	elsewhere := c.request(c.pod("elsewhere", "web", nodeB), ecKey(t), 0, nil)
	key := ecKey(t)
	req := c.request(c.pod("web-0", "web", nodeA), key, 0, nil)
	got, cond := c.answer(req)
	if cond.Type != "Issued" {
		t.Fatalf("condition %+v, want Issued", cond)
	}
	leaf := c.checkIssued(got, key, c.spiffeID("web"))
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life != testTTL {
		t.Errorf("certificate lives %s, want the TTL %s (the CA's backdating subtracted from the validity asked)", life, testTTL)
	}
	half := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2)
	if d := got.Status.BeginRefreshAt.Sub(half); d < -15*time.Minute || d > 15*time.Minute {
		t.Errorf("beginRefreshAt %s, want half the life (%s) ±1%%", got.Status.BeginRefreshAt, half)
	}
	md := c.ca.LastMetadata()
	if v := md.Get("authorization"); len(v) != 1 || v[0] != "Bearer "+c.agentToken {
		t.Errorf("the CA was not asked with the agent's own token: %v", v)
	}
	if r := c.ca.LastRequest(); r.GetMetadata().GetFields()[istio.ImpersonatedIdentityKey].GetStringValue() != c.spiffeID("web") {
		t.Errorf("the CA was not asked on the pod's behalf: %v", r.GetMetadata())
	}
	if n := c.ca.Requests(); n != 1 {
		t.Errorf("the CA got %d requests, want 1 (the other node's request is not the agent's)", n)
	}

	// The other node's request: listed by nobody here, so untouched.
	other, err := c.admin.CertificatesV1().PodCertificateRequests(c.ns).Get(context.Background(), elsewhere.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(other.Status.Conditions) != 0 || other.Status.CertificateChain != "" {
		t.Errorf("another node's request was answered: %+v", other.Status)
	}

	// The signer publishes no trust: that is the Publisher's.
	if _, err := c.admin.CertificatesV1().ClusterTrustBundles().Get(context.Background(), BundleName(c.signer), metav1.GetOptions{}); err == nil {
		t.Error("the signer published a ClusterTrustBundle")
	}
}

// The requests of these tests are made as a kubelet's are, and checked as
// the API server checks a kubelet's: a node cannot ask for another node's
// pod.
func TestNodeRestrictionApplies(t *testing.T) {
	c := newCluster(t, istioca.Config{})
	p := c.pod("web-0", "web", nodeA)
	_, err := c.requestAs(nodeB, p, ecKey(t), 0, nil)
	if !apierrors.IsForbidden(err) {
		t.Errorf("node %s asking for a pod of %s: %v, want Forbidden", nodeB, nodeA, err)
	}
}

// What the signer cannot sign is denied with the API's reasons.
func TestDenials(t *testing.T) {
	c := newCluster(t, istioca.Config{})
	c.startSigner(nil)
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		key         crypto.Signer
		annotations map[string]string
		reason      string
		message     []string
	}{
		{"ED25519, which the API server admits", ed, nil, "UnsupportedKeyType", []string{"ED25519", "use ECDSAP256"}},
		{"ECDSA P-521", p384, nil, "UnsupportedKeyType", []string{"ECDSAP521", "use ECDSAP256"}},
		{"an unknown annotation", ecKey(t), map[string]string{"example.com/ttl": "1h"}, "InvalidUnverifiedUserAnnotations", []string{"example.com/ttl"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := c.request(c.pod(fmt.Sprintf("denied-%d", i), "web", nodeA), tt.key, 0, tt.annotations)
			got, cond := c.answer(req)
			if cond.Type != "Denied" || cond.Reason != tt.reason || !containsAll(cond.Message, tt.message...) {
				t.Errorf("condition %s %s %q, want Denied %s with %q", cond.Type, cond.Reason, cond.Message, tt.reason, tt.message)
			}
			if got.Status.CertificateChain != "" {
				t.Error("a denied request carries a certificate")
			}
		})
	}
	if n := c.ca.Requests(); n != 0 {
		t.Errorf("the CA got %d requests for requests denied before", n)
	}
}

// The certificate never outlives the request's maxExpirationSeconds, even
// when the CA backdates more than the signer expected: the first answer
// then teaches it the backdating, and it asks again.
func TestLifetimeWithinTheRequest(t *testing.T) {
	c := newCluster(t, istioca.Config{})
	// The test CA backdates by a minute; expect five.
	c.startSigner(func(cfg *Config) { cfg.CABackdate = 5 * time.Minute })
	for i, wantCA := range []int{2, 3} {
		key := ecKey(t)
		got, cond := c.answer(c.request(c.pod(fmt.Sprintf("short-%d", i), "web", nodeA), key, 3600, nil))
		if cond.Type != "Issued" {
			t.Fatalf("request %d: condition %+v, want Issued", i, cond)
		}
		leaf := c.checkIssued(got, key, c.spiffeID("web"))
		if life := leaf.NotAfter.Sub(leaf.NotBefore); life != time.Hour {
			t.Errorf("request %d: certificate lives %s, want the hour the request allows", i, life)
		}
		// The first request costs two CA requests (too short a life with
		// the backdating expected, corrected), the next one only one.
		if n := c.ca.Requests(); n != wantCA {
			t.Errorf("after request %d the CA got %d requests, want %d", i, n, wantCA)
		}
	}
}

// A CA that refuses for good gets the request Failed; one that fails for a
// while is retried, with backoff, until it signs.
func TestCAFailures(t *testing.T) {
	c := newCluster(t, istioca.Config{})
	// An outage longer than MaxAttempts: the kubelet never asks again after
	// Failed, so a CA that cannot answer never fails a request.
	c.startSignerCache(func(cfg *Config) { cfg.MaxAttempts = 2 }, func(mc *secretmanager.Config) {
		mc.BackoffBase, mc.BackoffCap = 10*time.Millisecond, 40*time.Millisecond
	})

	c.ca.FailNext(4, codes.Unavailable)
	key := ecKey(t)
	got, cond := c.answer(c.request(c.pod("retried", "web", nodeA), key, 0, nil))
	if cond.Type != "Issued" {
		t.Fatalf("condition %+v, want Issued after the CA's outage", cond)
	}
	c.checkIssued(got, key, c.spiffeID("web"))
	if n := c.ca.Requests(); n != 5 {
		t.Errorf("the CA got %d requests, want 5 (four failed)", n)
	}

	c.ca.SetError(codes.PermissionDenied)
	c.ca.SetMode(istioca.ModeError)
	got, cond = c.answer(c.request(c.pod("refused", "web", nodeA), ecKey(t), 0, nil))
	if cond.Type != "Failed" || cond.Reason != ReasonCARefused || got.Status.CertificateChain != "" {
		t.Errorf("condition %+v, want Failed %s", cond, ReasonCARefused)
	}
	if n := c.ca.Requests(); n != 6 {
		t.Errorf("the CA got %d requests, want one more, not retried", n)
	}

	// An answer that fails the checks is retried like a failure.
	c.ca.SetMode(istioca.ModeWrongKey)
	got, cond = c.answer(c.request(c.pod("wrongkey", "web", nodeA), ecKey(t), 0, nil))
	if cond.Type != "Failed" || cond.Reason != ReasonCAUnavailable || !containsAll(cond.Message, "does not match") {
		t.Errorf("condition %+v, want Failed %s after every answer was rejected", cond, ReasonCAUnavailable)
	}
	if n := c.ca.Requests(); n != 6+2 {
		t.Errorf("the CA got %d requests, want %d (MaxAttempts 2)", n, 6+2)
	}

	// A leaf that is itself a CA would let the pod mint any identity: never
	// written to the request.
	c.ca.SetMode(istioca.ModeLeafIsCA)
	got, cond = c.answer(c.request(c.pod("leafisca", "web", nodeA), ecKey(t), 0, nil))
	if cond.Type != "Failed" || got.Status.CertificateChain != "" || !containsAll(cond.Message, "is a CA") {
		t.Errorf("condition %+v, chain %q: want Failed, no chain, after every answer was a CA", cond, got.Status.CertificateChain)
	}
}

// 100 requests of 20 service accounts are all issued, never more than the
// CSR budget in flight at the CA.
func TestHundredRequestsWithinTheBudget(t *testing.T) {
	c := newCluster(t, istioca.Config{})
	const budget = 4
	c.startSignerCache(nil, func(mc *secretmanager.Config) { mc.MaxConcurrentCSRs = budget })
	// Slow answers, so requests overlap at the CA if the budget lets them.
	c.ca.SetDelay(20 * time.Millisecond)

	type sent struct {
		req *certsv1.PodCertificateRequest
		key crypto.Signer
		sa  string
	}
	var reqs []sent
	for i := range 100 {
		sa := fmt.Sprintf("sa-%d", i%20)
		key := ecKey(t)
		reqs = append(reqs, sent{c.request(c.pod(fmt.Sprintf("p-%d", i), sa, nodeA), key, 0, nil), key, sa})
	}
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Go(func() {
			got, cond := c.answer(r.req)
			if cond.Type != "Issued" {
				t.Errorf("%s: condition %+v", r.req.Name, cond)
				return
			}
			c.checkIssued(got, r.key, c.spiffeID(r.sa))
		})
	}
	wg.Wait()
	if n := c.ca.Requests(); n != 100 {
		t.Errorf("the CA got %d requests, want 100", n)
	}
	if m := c.ca.MaxInFlight(); m > budget || m < 2 {
		t.Errorf("at most %d requests in flight at the CA, want 2..%d", m, budget)
	}
}

// Under Linkerd every request is denied with the reason.
func TestRefuseDenies(t *testing.T) {
	c := newCluster(t, istioca.Config{})
	c.startSigner(func(cfg *Config) { cfg.CA, cfg.Refuse = nil, "Linkerd's CA cannot sign a stub CSR" })
	_, cond := c.answer(c.request(c.pod("linkerd", "web", nodeA), ecKey(t), 0, nil))
	if cond.Type != "Denied" || cond.Reason != ReasonUnsupportedCA || cond.Message != "Linkerd's CA cannot sign a stub CSR" {
		t.Errorf("condition %+v", cond)
	}
}

// The publisher writes the signer's ClusterTrustBundle and rewrites it on
// a root change; one that another writer changed is put back at the next
// resync.
func TestPublisherFollowsRoots(t *testing.T) {
	c := newCluster(t, istioca.Config{})
	pubSigner := "meshagent.io/publisher-" + c.ns // the other tests' signers have no bundle
	roots, err := secret.NewRoots(c.ca.RootPEM(), "test-ca")
	if err != nil {
		t.Fatal(err)
	}
	api, err := kubeclient.NewCertificates(c.env.Config())
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPublisher(PublisherConfig{SignerName: pubSigner, API: api, Roots: roots, BundleResync: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	bundle := func() string {
		b, err := c.admin.CertificatesV1().ClusterTrustBundles().Get(context.Background(), BundleName(pubSigner), metav1.GetOptions{})
		if err != nil || b.Spec.SignerName != pubSigner {
			return ""
		}
		return b.Spec.TrustBundle
	}
	eventually(t, "the ClusterTrustBundle with the CA's root", func() bool { return bundle() == string(c.ca.RootPEM()) })

	next, err := localca.New(localca.Config{Name: "next root"})
	if err != nil {
		t.Fatal(err)
	}
	both := append(append([]byte(nil), c.ca.RootPEM()...), next.RootPEM()...)
	if err := roots.Set(both, "rotation"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ClusterTrustBundle with both roots", func() bool { return bundle() == string(both) })

	b, err := c.admin.CertificatesV1().ClusterTrustBundles().Get(context.Background(), BundleName(pubSigner), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Spec.TrustBundle = string(next.RootPEM())
	if _, err := c.admin.CertificatesV1().ClusterTrustBundles().Update(context.Background(), b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ClusterTrustBundle put back", func() bool { return bundle() == string(both) })
}

// After an outage the node's requests may be listed before its pods (the pod
// list is the larger): a pending request older than PodWait is then not
// denied for a pod the index has not listed yet. Workers start once both
// lists are in, and PodWait counts from the pod list.
func TestPodListAfterRequestList(t *testing.T) {
	c := newCluster(t, istioca.Config{})
	key := ecKey(t)
	req := c.request(c.pod("listed-late", "web", nodeA), key, 0, nil)
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	c.podGate = gate
	// PodWait 1ns: every pending request is older than PodWait, as after an
	// agent restart that took longer than PodWait.
	s, _ := c.startSigner(func(cfg *Config) { cfg.PodWait = time.Nanosecond })
	t.Cleanup(open) // after the signer's cleanup is registered: runs first
	eventually(t, "the request list", s.informer.HasSynced)
	if s.HasSynced() {
		t.Fatal("the signer says it synced before the pod index listed the node's pods")
	}
	// Hold the pod list for a second, or until the request is answered
	// (what a signer that does not wait for the pods does at once).
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got, err := c.admin.CertificatesV1().PodCertificateRequests(req.Namespace).Get(context.Background(), req.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) > 0 {
			break
		}
	}
	open()
	got, cond := c.answer(req)
	if cond.Type != "Issued" {
		t.Fatalf("condition %+v, want Issued: the pod was on the node, its list came late", cond)
	}
	c.checkIssued(got, key, c.spiffeID("web"))
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Within(t, 30*time.Second, what, cond)
}

// refusingCA fails every request for one identity and passes the others
// on to the CA.
type refusingCA struct {
	CA     secretmanager.Signer
	refuse string
	mu     sync.Mutex
	calls  int
}

func (r *refusingCA) Sign(ctx context.Context, csr []byte, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	if id.SPIFFEID == r.refuse {
		r.mu.Lock()
		r.calls++
		r.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "no certificates for this identity now")
	}
	return r.CA.Sign(ctx, csr, id, ttl)
}

func (r *refusingCA) refused() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// A failing identity waits out its backoff without holding the one CSR
// slot: another pod's request is issued meanwhile, before the failing one
// is tried again.
func TestFailingIdentityDelaysNoOther(t *testing.T) {
	c := newCluster(t, istioca.Config{})
	ca := &refusingCA{CA: c.agentCA(), refuse: c.spiffeID("broken")}
	c.startSignerCache(nil, func(mc *secretmanager.Config) {
		mc.CSRSigner = ca
		mc.MaxConcurrentCSRs = 1
		mc.BackoffBase, mc.BackoffCap = 10*time.Second, 10*time.Second // the first retry after 5..10s
	})
	broken := c.request(c.pod("broken-0", "broken", nodeA), ecKey(t), 0, nil)
	eventually(t, "the broken identity's first CA request", func() bool { return ca.refused() == 1 })

	key := ecKey(t)
	got, cond := c.answer(c.request(c.pod("fine-0", "fine", nodeA), key, 0, nil))
	if cond.Type != "Issued" {
		t.Fatalf("condition %+v, want Issued", cond)
	}
	c.checkIssued(got, key, c.spiffeID("fine"))
	if n := ca.refused(); n != 1 {
		t.Errorf("the failing identity was tried %d times before the other was issued, want once: it held the slot through its backoff", n)
	}
	b, err := c.admin.CertificatesV1().PodCertificateRequests(c.ns).Get(context.Background(), broken.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Status.Conditions) != 0 {
		t.Errorf("the failing request was answered: %+v", b.Status.Conditions)
	}
}

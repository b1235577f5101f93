package istioca

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/meshagent/meshagent/internal/pki"
)

// DefaultAudience is the audience a TokenReview asks for when
// Config.Audiences is empty: istiod's.
const DefaultAudience = "istio-ca"

// ImpersonatedIdentityKey is the request metadata field in which a node
// agent names the identity it asks for on behalf of a pod on its node.
const ImpersonatedIdentityKey = "ImpersonatedIdentity"

// Keys of a TokenReview's status.user.extra for a pod-bound token.
const (
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
	extraNodeName = "authentication.kubernetes.io/node-name"
)

// errDenied is the one message every authorization failure answers with:
// the reason goes to Denials, never to the caller.
const errDenied = "istioca: authentication failed"

// Review is what one TokenReview of a caller's token said.
type Review struct {
	// Token is the token reviewed.
	Token string
	// Authenticated is the review's verdict; Error says why not.
	Authenticated bool
	Error         string
	// ServiceAccount is the caller, from the user name
	// system:serviceaccount:<ns>:<sa>.
	ServiceAccount ServiceAccount
	// Audiences are the audiences the API server says the token is valid for.
	Audiences []string
	// PodName, PodUID and NodeName are the bound pod's, from the review's
	// extras; empty for a token not bound to a pod.
	PodName, PodUID, NodeName string
	// IssuedAt and Expiry are read from the token's claims once the API
	// server has accepted it.
	IssuedAt, Expiry time.Time
}

// caller is an authenticated caller: its identity and, for a caller
// authenticated by TokenReview, the review.
type caller struct {
	id     pki.Identity
	review *Review
}

// review asks the API server who tok belongs to, as istiod does: the token
// must be valid for one of the configured audiences and belong to a service
// account.
func (s *Server) review(ctx context.Context, tok string) (Review, error) {
	r := Review{Token: tok}
	tr, err := s.cfg.Kube.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: tok, Audiences: s.audiences()},
	}, metav1.CreateOptions{})
	if err != nil {
		r.Error = "token review: " + err.Error()
		return r, errors.New(r.Error)
	}
	st := tr.Status
	r.Audiences = st.Audiences
	if !st.Authenticated {
		r.Error = "not authenticated: " + st.Error
		return r, errors.New(r.Error)
	}
	if !slices.ContainsFunc(st.Audiences, func(a string) bool { return slices.Contains(s.audiences(), a) }) {
		r.Error = fmt.Sprintf("token audiences %v, want one of %v", st.Audiences, s.audiences())
		return r, errors.New(r.Error)
	}
	parts := strings.Split(st.User.Username, ":")
	if len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" || parts[2] == "" || parts[3] == "" {
		r.Error = fmt.Sprintf("user %q is not a service account", st.User.Username)
		return r, errors.New(r.Error)
	}
	r.Authenticated = true
	r.ServiceAccount = ServiceAccount{Namespace: parts[2], Name: parts[3]}
	r.PodName = first(st.User.Extra[extraPodName])
	r.PodUID = first(st.User.Extra[extraPodUID])
	r.NodeName = first(st.User.Extra[extraNodeName])
	r.IssuedAt, r.Expiry = claimTimes(tok)
	return r, nil
}

func (s *Server) audiences() []string {
	if len(s.cfg.Audiences) > 0 {
		return s.cfg.Audiences
	}
	return []string{DefaultAudience}
}

func first(v authnv1.ExtraValue) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// claimTimes reads iat and exp from a JWT the API server has accepted (its
// signature was checked there).
func claimTimes(tok string) (iat, exp time.Time) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return
	}
	var c struct {
		IssuedAt int64 `json:"iat"`
		Expiry   int64 `json:"exp"`
	}
	if json.Unmarshal(b, &c) != nil {
		return
	}
	return time.Unix(c.IssuedAt, 0), time.Unix(c.Expiry, 0)
}

// authorizeImpersonation decides whether c may obtain a certificate for the
// SPIFFE ID want, as istiod's node authorizer does: the caller's service
// account is trusted, its pod still exists with the UID in its token, and a
// pod of the wanted service account that has not failed runs on the
// caller's node. The pods come from the pod cache; what it lacks after
// Config.PodCacheWait is asked of the API server once (see callerPod and
// podOnNode). The error is the reason, for Denials.
func (s *Server) authorizeImpersonation(ctx context.Context, c caller, want string) (pki.Identity, error) {
	id := pki.Identity{SPIFFEID: want}
	if err := id.Validate(); err != nil {
		return pki.Identity{}, fmt.Errorf("impersonated identity %q: %w", want, err)
	}
	td, ns, sa, ok := parseSPIFFE(want)
	if !ok || td != s.cfg.TrustDomain {
		return pki.Identity{}, fmt.Errorf("impersonated identity %q is not a service account of trust domain %s", want, s.cfg.TrustDomain)
	}
	r := c.review
	if r == nil {
		return pki.Identity{}, errors.New("impersonation needs a caller authenticated by TokenReview")
	}
	if !slices.Contains(s.cfg.TrustedNodeAccounts, r.ServiceAccount) {
		return pki.Identity{}, fmt.Errorf("caller %s/%s is not a trusted node account", r.ServiceAccount.Namespace, r.ServiceAccount.Name)
	}
	if r.PodName == "" || r.PodUID == "" {
		return pki.Identity{}, errors.New("caller's token is not bound to a pod")
	}
	pod, err := s.callerPod(ctx, r.ServiceAccount.Namespace, r.PodName, r.PodUID)
	if err != nil {
		return pki.Identity{}, err
	}
	node := pod.Spec.NodeName
	if node == "" {
		return pki.Identity{}, fmt.Errorf("caller's pod %s/%s is not on a node", pod.Namespace, pod.Name)
	}
	if err := s.podOnNode(ctx, node, ns, sa); err != nil {
		return pki.Identity{}, err
	}
	return id, nil
}

// callerPod returns the caller's pod ns/name when it has the UID its token
// is bound to: from the pod cache, waiting for it there up to
// Config.PodCacheWait if it is not there yet (or an older pod of the same
// name is), else by one Get.
func (s *Server) callerPod(ctx context.Context, ns, name, uid string) (*corev1.Pod, error) {
	var p *corev1.Pod
	cached := func() bool {
		p = s.pods.pod(ns, name)
		return p != nil && string(p.UID) == uid
	}
	if s.fromCache(ctx, cached) {
		return p, nil
	}
	pod, err := s.cfg.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("caller's pod %s/%s: %w", ns, name, err)
	}
	if string(pod.UID) != uid {
		return nil, fmt.Errorf("caller's pod %s/%s has UID %s, the token names %s", pod.Namespace, pod.Name, pod.UID, uid)
	}
	return pod, nil
}

// podOnNode returns nil when a pod of ns/sa that has not failed runs on
// node: from the pod cache, waiting for one there up to
// Config.PodCacheWait, else by one List of the namespace's pods on the
// node.
func (s *Server) podOnNode(ctx context.Context, node, ns, sa string) error {
	if s.fromCache(ctx, func() bool { return s.pods.onNode(node, ns, sa) }) {
		return nil
	}
	pods, err := s.cfg.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return fmt.Errorf("listing pods of %s on node %s: %w", ns, node, err)
	}
	for _, p := range pods.Items {
		if p.Spec.ServiceAccountName == sa && p.Status.Phase != corev1.PodFailed {
			return nil
		}
	}
	return fmt.Errorf("no pod of %s/%s runs on node %s", ns, sa, node)
}

// fromCache reports whether cached holds now or, after a miss, within
// Config.PodCacheWait as the pod informer catches up. A false answer is
// counted as an API server read, which the caller then makes.
func (s *Server) fromCache(ctx context.Context, cached func() bool) bool {
	if cached() {
		return true
	}
	s.mu.Lock()
	s.podMisses++
	s.mu.Unlock()
	if s.pods.await(ctx, s.cfg.PodCacheWait, cached) {
		return true
	}
	s.mu.Lock()
	s.podReads++
	s.mu.Unlock()
	return false
}

// PodCacheMisses is how many of the node authorizer's look-ups (a caller's
// pod, a pod of an account on a node) its pod cache could not answer at
// once.
func (s *Server) PodCacheMisses() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.podMisses
}

// PodReads is how many of those misses the informer did not fill within
// Config.PodCacheWait, so that the node authorizer asked the API server (a
// Get of the caller's pod or a List of a namespace's pods on a node).
func (s *Server) PodReads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.podReads
}

// parseSPIFFE splits spiffe://<td>/ns/<ns>/sa/<sa>.
func parseSPIFFE(id string) (td, ns, sa string, ok bool) {
	rest, ok := strings.CutPrefix(id, "spiffe://")
	if !ok {
		return "", "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 5 || parts[1] != "ns" || parts[3] != "sa" || parts[2] == "" || parts[4] == "" {
		return "", "", "", false
	}
	return parts[0], parts[2], parts[4], true
}

package podcert

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/secretmanager"
)

// Reasons of the Denied and Failed conditions the signer writes, besides
// the API's own UnsupportedKeyType and InvalidUnverifiedUserAnnotations.
const (
	ReasonIssued           = "Issued"
	ReasonUnsupportedCA    = "UnsupportedCA"
	ReasonInvalidStubCSR   = "InvalidStubPKCS10Request"
	ReasonPodNotOnNode     = "PodNotOnNode"
	ReasonPodMismatch      = "PodMismatch"
	ReasonPodTerminated    = "PodTerminated"
	ReasonCARefused        = "CARefused"
	ReasonCAUnavailable    = "CAUnavailable"
	ReasonLifetimeRejected = "LifetimeRejected"
)

// SuggestedKeyType is the key type a denial for an unsupported one suggests.
const SuggestedKeyType = "ECDSAP256"

// podRetry is how soon a request for a pod the index does not hold yet is
// looked at again.
const podRetry = time.Second

// verdict is what to do with a request: write a terminal condition (with
// the chain, when issued), or look again after retry.
type verdict struct {
	condition string // Issued, Denied or Failed; empty: retry
	reason    string
	message   string
	chain     []*x509.Certificate
	refresh   time.Time
	retry     time.Duration
}

func deny(reason, format string, args ...any) verdict {
	return verdict{condition: kubeclient.PodCertificateRequestDenied, reason: reason, message: fmt.Sprintf(format, args...)}
}

func fail(reason, format string, args ...any) verdict {
	return verdict{condition: kubeclient.PodCertificateRequestFailed, reason: reason, message: fmt.Sprintf(format, args...)}
}

func retryAfter(d time.Duration) verdict { return verdict{retry: d} }

// process answers the request under key, if it still awaits an answer, and
// says whether and when to look at it again.
func (s *Signer) process(ctx context.Context, key string) (time.Duration, bool) {
	obj, exists, err := s.informer.GetStore().GetByKey(key)
	if err != nil || !exists {
		s.forget(key)
		return 0, false
	}
	req := obj.(*kubeclient.PodCertificateRequest)
	if req.Spec.SignerName != s.cfg.SignerName || req.Spec.NodeName != s.cfg.NodeName || answered(req) {
		s.forget(key)
		return 0, false
	}
	v := s.decide(ctx, key, req)
	if v.condition == "" {
		return v.retry, ctx.Err() == nil
	}
	log := s.log.With(zap.String(logkeys.Request, key), zap.String(logkeys.Pod, req.Namespace+"/"+req.Spec.PodName))
	if err := s.write(ctx, req, v); err != nil {
		if apierrors.IsNotFound(err) || ctx.Err() != nil {
			return 0, false
		}
		if apierrors.IsInvalid(err) && v.condition == kubeclient.PodCertificateRequestIssued {
			// The API server refuses the certificate: say why, once.
			log.Warn("the API server refused the issued certificate", zap.Error(err))
			v = fail(ReasonLifetimeRejected, "the API server refused the certificate the CA issued: %v", err)
			err = s.write(ctx, req, v)
		}
		if err != nil {
			log.Warn("cannot write the request's status", zap.String(logkeys.Condition, v.condition), zap.Error(err))
			return s.failedAttempt(key), true
		}
	}
	s.forget(key)
	s.metrics.requests.WithLabelValues(strings.ToLower(v.condition)).Inc()
	if v.condition == kubeclient.PodCertificateRequestIssued {
		log.Info("pod certificate issued", zap.String(logkeys.Message, v.message),
			zap.Time(logkeys.NotAfter, v.chain[0].NotAfter), zap.Time(logkeys.RefreshAt, v.refresh))
	} else {
		log.Warn("pod certificate request answered without a certificate",
			zap.String(logkeys.Condition, v.condition), zap.String(logkeys.Reason, v.reason), zap.String(logkeys.Message, v.message))
	}
	return 0, false
}

// podWaitFrom is when PodWait starts for req: its creation, or the pod
// index's first full list if that came later.
func (s *Signer) podWaitFrom(req *kubeclient.PodCertificateRequest) time.Time {
	s.mu.Lock()
	synced := s.podsSynced
	s.mu.Unlock()
	if synced.IsZero() {
		synced = s.cfg.Clock.Now() // not synced yet: the wait has not begun
	}
	if created := req.CreationTimestamp.Time; created.After(synced) {
		return created
	}
	return synced
}

// checkSpec checks what a request asks for, before any pod or CA is
// consulted, and returns its stub CSR; a verdict with a condition denies it.
func checkSpec(signer string, spec *kubeclient.PodCertificateRequestSpec) (*x509.CertificateRequest, verdict) {
	if len(spec.UnverifiedUserAnnotations) > 0 {
		keys := make([]string, 0, len(spec.UnverifiedUserAnnotations))
		for k := range spec.UnverifiedUserAnnotations {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return nil, deny(kubeclient.ReasonInvalidUserAnnotations,
			"signer %s takes no unverifiedUserAnnotations (the identity is the pod's service account); remove %s",
			signer, strings.Join(keys, ", "))
	}
	csr, err := x509.ParseCertificateRequest(spec.StubPKCS10Request)
	if err != nil {
		return nil, deny(ReasonInvalidStubCSR, "stubPKCS10Request does not parse: %v", err)
	}
	if name, ok := keyTypeSupported(csr.PublicKey); !ok {
		return nil, deny(kubeclient.ReasonUnsupportedKeyType,
			"signer %s does not issue for %s keys (mesh proxies cannot use them); use %s (or ECDSAP384, RSA3072, RSA4096)",
			signer, name, SuggestedKeyType)
	}
	if !stubEmpty(csr) {
		return nil, deny(ReasonInvalidStubCSR, "stubPKCS10Request must be empty (no subject, names or extensions): the identity is the pod's service account")
	}
	return csr, verdict{}
}

// decide checks the request, asks the CA and checks its answer.
func (s *Signer) decide(ctx context.Context, key string, req *kubeclient.PodCertificateRequest) verdict {
	if s.cfg.Refuse != "" {
		return deny(ReasonUnsupportedCA, "%s", s.cfg.Refuse)
	}
	csr, v := checkSpec(s.cfg.SignerName, &req.Spec)
	if v.condition != "" {
		return v
	}
	pod, ok := s.cfg.Pods.Get(string(req.Spec.PodUID))
	if !ok {
		if !s.cfg.Pods.HasSynced() || s.cfg.Clock.Since(s.podWaitFrom(req)) < s.cfg.PodWait {
			return retryAfter(podRetry)
		}
		return deny(ReasonPodNotOnNode, "pod %s/%s (uid %s) is not on node %s", req.Namespace, req.Spec.PodName, req.Spec.PodUID, s.cfg.NodeName)
	}
	if pod.Namespace != req.Namespace || pod.Name != req.Spec.PodName || pod.ServiceAccount != req.Spec.ServiceAccountName || pod.NodeName != s.cfg.NodeName {
		return deny(ReasonPodMismatch, "the request names pod %s/%s with service account %s; the pod with uid %s is %s with service account %s",
			req.Namespace, req.Spec.PodName, req.Spec.ServiceAccountName, req.Spec.PodUID, pod, pod.ServiceAccount)
	}
	if pod.Terminated() {
		return fail(ReasonPodTerminated, "pod %s has terminated (%s)", pod, pod.Phase)
	}
	id := pod.Identity
	maxExp := DefaultMaxExpiration
	if req.Spec.MaxExpirationSeconds != nil {
		maxExp = time.Duration(*req.Spec.MaxExpirationSeconds) * time.Second
	}
	// One extra request when the CA's backdating was not what was expected
	// and the first answer lives too long (or too short) for the request.
	for try := 0; ; try++ {
		plan := planLifetime(s.cfg.TTL, maxExp, s.currentBackdate())
		// The answer comes checked (pki.VerifyIssued with the stub's key,
		// the pod's identity and the roots in force).
		chain, err := s.sign(ctx, req.Spec.StubPKCS10Request, csr.PublicKey, id, plan.ask)
		var backoff *secretmanager.BackoffError
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return retryAfter(0)
		case errors.As(err, &backoff) && errors.Is(err, secretmanager.ErrBackingOff):
			return retryAfter(backoff.RetryIn)
		case errors.As(err, &backoff):
			return s.caFailure(key, id, backoff.Err, backoff.RetryIn, errors.Is(err, secretmanager.ErrRejected))
		default:
			return fail(ReasonCARefused, "the CA refused to sign for %s: %v", id, err)
		}
		now := s.cfg.Clock.Now()
		leaf := chain[0]
		// What the CA added to the validity asked is its backdating.
		if extra := leaf.NotAfter.Sub(leaf.NotBefore) - plan.ask; extra >= 0 && extra <= MaxNotBeforeSkew {
			s.setBackdate(extra)
		}
		if err := lifetimeCheck(leaf.NotBefore, leaf.NotAfter, maxExp, now); err != nil {
			again := planLifetime(s.cfg.TTL, maxExp, s.currentBackdate())
			if try == 0 && again.ask != plan.ask && (errors.Is(err, errTooLong) || errors.Is(err, errTooShort)) {
				continue
			}
			return fail(ReasonLifetimeRejected, "the CA's certificate cannot be accepted for this request: %v", err)
		}
		return verdict{
			condition: kubeclient.PodCertificateRequestIssued,
			reason:    ReasonIssued,
			message:   "issued for " + id.String(),
			chain:     chain,
			refresh:   beginRefreshAt(leaf.NotBefore, leaf.NotAfter, s.cfg.RefreshRatio, s.cfg.RefreshJitter, s.cfg.Rand()),
		}
	}
}

// sign sends one CSR to the CA through the agent's signing pipeline.
func (s *Signer) sign(ctx context.Context, csr []byte, pub crypto.PublicKey, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	started := false
	signed, err := s.cfg.CA.SignCSR(ctx, secretmanager.CSRJob{
		CSR: csr, PublicKey: pub, Identity: id, TTL: ttl,
		OnStart: func() { started = true; s.metrics.inFlight.Inc() },
	})
	if !started {
		return nil, err
	}
	s.metrics.inFlight.Dec()
	s.metrics.latency.Observe(signed.Latency.Seconds())
	if err != nil && !errors.Is(err, secretmanager.ErrRejected) {
		s.metrics.caRequests.WithLabelValues(resultCAError).Inc()
		return nil, err
	}
	s.metrics.caRequests.WithLabelValues(resultSuccess).Inc()
	return signed.Chain, err
}

// caFailure answers a failed CA request of key, whose identity backs off
// for wait (secretmanager's backoff). A
// rejected answer (counted) also counts towards MaxAttempts, after which the
// request is Failed; a CA that could not answer (down, overloaded, timed
// out) is retried for as long as the request is pending, because the
// kubelet never asks again after Failed: the pod would wait for ever for
// its first certificate, or keep its old one until it expires.
func (s *Signer) caFailure(key string, id pki.Identity, err error, wait time.Duration, counted bool) verdict {
	s.mu.Lock()
	if counted {
		s.attempts[key]++
	}
	n := s.attempts[key]
	s.mu.Unlock()
	if counted && n >= s.cfg.MaxAttempts {
		return fail(ReasonCAUnavailable, "no certificate for %s after %d CA requests: %v", id, n, err)
	}
	s.log.Warn("pod certificate request failed; retrying", zap.String(logkeys.Request, key), zap.String(logkeys.Identity, id.String()),
		zap.Int(logkeys.Attempt, n), zap.Duration(logkeys.RetryIn, wait), zap.Error(err))
	return retryAfter(wait)
}

// failedAttempt counts a failed status write of key and returns the wait
// before the next try.
func (s *Signer) failedAttempt(key string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts[key]++
	return s.backoff.Delay(s.attempts[key]-1, s.cfg.Rand())
}

func (s *Signer) currentBackdate() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backdate
}

func (s *Signer) setBackdate(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d != s.backdate {
		s.log.Info("the CA's backdating differs from the one expected; asking for validities adjusted to it",
			zap.Duration(logkeys.Backdate, d), zap.Duration(logkeys.Expected, s.backdate))
	}
	s.backdate = d
}

// keyTypeSupported names the key type of pub as the API does and says
// whether the signer issues for it: the key types mesh proxies (Envoy,
// gRPC) accept in certificates, RSA 3072/4096 and ECDSA P-256/P-384.
func keyTypeSupported(pub any) (string, bool) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return "ECDSAP256", true
		case elliptic.P384():
			return "ECDSAP384", true
		case elliptic.P521():
			return "ECDSAP521", false
		}
		return "ECDSA " + k.Curve.Params().Name, false
	case *rsa.PublicKey:
		bits := k.N.BitLen()
		return fmt.Sprintf("RSA%d", bits), bits == 3072 || bits == 4096
	case ed25519.PublicKey:
		return "ED25519", false
	}
	return fmt.Sprintf("%T", pub), false
}

// stubEmpty reports whether the CSR asks for nothing beyond its key, as
// the kubelet's stub CSRs do.
func stubEmpty(csr *x509.CertificateRequest) bool {
	return len(csr.Subject.Names) == 0 && len(csr.DNSNames) == 0 && len(csr.URIs) == 0 &&
		len(csr.IPAddresses) == 0 && len(csr.EmailAddresses) == 0 && len(csr.Extensions) == 0
}

// write sets the request's terminal condition (and, when issued, the
// chain and its times) through the status subresource.
func (s *Signer) write(ctx context.Context, req *kubeclient.PodCertificateRequest, v verdict) error {
	out := req.DeepCopy()
	now := metav1.NewTime(s.cfg.Clock.Now())
	out.Status.Conditions = append(out.Status.Conditions, metav1.Condition{
		Type:               v.condition,
		Status:             metav1.ConditionTrue,
		Reason:             v.reason,
		Message:            truncate(v.message, 1024),
		LastTransitionTime: now,
		ObservedGeneration: req.Generation,
	})
	if v.condition == kubeclient.PodCertificateRequestIssued {
		leaf := v.chain[0]
		nb, na, rf := metav1.NewTime(leaf.NotBefore), metav1.NewTime(leaf.NotAfter), metav1.NewTime(v.refresh)
		out.Status.CertificateChain = string(pki.EncodeCertificates(issuedChain(v.chain, s.roots().Certs())))
		out.Status.NotBefore, out.Status.NotAfter, out.Status.BeginRefreshAt = &nb, &na, &rf
	}
	_, err := s.cfg.API.UpdatePodCertificateRequestStatus(ctx, out)
	return err
}

// issuedChain is the leaf and its intermediates: a root the CA appended
// is left out, as TLS peers present no root (the roots are the
// ClusterTrustBundle's).
func issuedChain(chain, roots []*x509.Certificate) []*x509.Certificate {
	out := []*x509.Certificate{chain[0]}
	for _, c := range chain[1:] {
		if slices.ContainsFunc(roots, c.Equal) {
			continue
		}
		out = append(out, c)
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// roots returns the mesh's current trust bundle.
func (s *Signer) roots() *pki.Bundle {
	b, _ := s.cfg.Roots.Bundle()
	return b
}

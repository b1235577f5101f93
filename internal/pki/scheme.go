package pki

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Scheme is how a mesh names its workloads, and the rules that follow from
// it: Istio names a workload by a SPIFFE ID, spiffe://<trust domain>/ns/<ns>/sa/<sa>;
// Linkerd by a DNS-like name, <sa>.<ns>.serviceaccount.identity.<control
// namespace>.<trust domain>. A Scheme is made once from the configuration
// (IstioScheme, LinkerdScheme) and passed as a value; it owns the identity of
// a namespace and service account (Identity) and back (Account), the renewal
// policy (Renewal), the audience of the tokens the CA accepts
// (TokenAudience) and the name the CA presents (CAServerName).
//
// The zero Scheme is not usable: IsZero reports it.
type Scheme struct {
	linkerd bool
	td      spiffeid.TrustDomain
	// controlNS is Linkerd's control-plane namespace.
	controlNS string
}

// Token audiences the CAs check.
const (
	// IstioAudience is the audience of tokens istiod's CA accepts.
	IstioAudience = "istio-ca"
	// LinkerdAudience is the audience of tokens Linkerd's identity service accepts.
	LinkerdAudience = "identity.l5d.io"
)

// Defaults of the Linkerd scheme.
const (
	DefaultTrustDomain             = "cluster.local"
	DefaultLinkerdControlNamespace = "linkerd"
)

// LinkerdGraceRatio is the share of life left when a Linkerd certificate is
// renewed: the Linkerd proxy refreshes at 70 % of the remaining life.
const LinkerdGraceRatio = 0.3

// Renewal is when a certificate of the scheme is renewed: when GraceRatio of
// its life is left, with the delay from its receipt to its renewal clamped
// to [MinDelay, MaxDelay] (zero: no bound).
type Renewal struct {
	GraceRatio         float64
	MinDelay, MaxDelay time.Duration
}

var (
	// istioRenewal is pilot-agent's: renew at half the life.
	istioRenewal = Renewal{GraceRatio: 0.5}
	// linkerdRenewal is Linkerd's proxy's: renew at 70 % of the life, not
	// sooner than 10 s nor later than 24 h after receipt.
	linkerdRenewal = Renewal{GraceRatio: LinkerdGraceRatio, MinDelay: 10 * time.Second, MaxDelay: 24 * time.Hour}
)

// IstioScheme is the SPIFFE naming of Istio under trustDomain.
func IstioScheme(trustDomain string) (Scheme, error) {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return Scheme{}, fmt.Errorf("trust domain %q: %w", trustDomain, err)
	}
	return Scheme{td: td}, nil
}

// LinkerdScheme is Linkerd's naming under trustDomain, with its control plane
// in controlNamespace ("" means DefaultLinkerdControlNamespace).
func LinkerdScheme(trustDomain, controlNamespace string) (Scheme, error) {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return Scheme{}, fmt.Errorf("trust domain %q: %w", trustDomain, err)
	}
	if controlNamespace == "" {
		controlNamespace = DefaultLinkerdControlNamespace
	}
	if !isDNSLabel(controlNamespace) {
		return Scheme{}, fmt.Errorf("linkerd namespace %q is not a DNS label", controlNamespace)
	}
	return Scheme{linkerd: true, td: td, controlNS: controlNamespace}, nil
}

// IsZero reports whether s was made by neither constructor.
func (s Scheme) IsZero() bool { return s.td.IsZero() }

// IsLinkerd reports whether s is Linkerd's naming.
func (s Scheme) IsLinkerd() bool { return s.linkerd }

// TrustDomain is the scheme's trust domain.
func (s Scheme) TrustDomain() string { return s.td.Name() }

// String is "istio (<trust domain>)" or "linkerd (<trust domain>, <namespace>)".
func (s Scheme) String() string {
	if s.linkerd {
		return "linkerd (" + s.td.Name() + ", " + s.controlNS + ")"
	}
	return "istio (" + s.td.Name() + ")"
}

// Identity is the identity of the workloads running as serviceAccount in
// namespace. It fails when either name cannot be part of the identity.
func (s Scheme) Identity(namespace, serviceAccount string) (Identity, error) {
	if s.IsZero() {
		return Identity{}, errors.New("identity scheme not set")
	}
	if namespace == "" || serviceAccount == "" {
		return Identity{}, fmt.Errorf("identity of namespace %q and service account %q: both are needed", namespace, serviceAccount)
	}
	if s.linkerd {
		if !isDNSLabel(namespace) {
			return Identity{}, fmt.Errorf("namespace %q is not a DNS label", namespace)
		}
		id := LinkerdIdentity(s.td.Name(), namespace, serviceAccount, s.controlNS)
		if err := id.Validate(); err != nil {
			return Identity{}, err
		}
		return id, nil
	}
	// Each name must be one path segment of the SPIFFE ID.
	if _, err := spiffeid.FromSegments(s.td, "ns", namespace, "sa", serviceAccount); err != nil {
		return Identity{}, fmt.Errorf("identity of namespace %q and service account %q: %w", namespace, serviceAccount, err)
	}
	return SPIFFEIdentity(s.td.Name(), namespace, serviceAccount), nil
}

// Account is the inverse of Identity: the namespace and service account id
// names. ok is false when id is not a service-account identity of s. (A
// Linkerd namespace is a DNS label, without dots, while a service account's
// name may hold dots: the name splits at its last dot.)
func (s Scheme) Account(id Identity) (namespace, serviceAccount string, ok bool) {
	if s.IsZero() {
		return "", "", false
	}
	if s.linkerd {
		rest, found := strings.CutSuffix(id.DNSName, linkerdSuffix(s.td.Name(), s.controlNS))
		if !found || id.SPIFFEID != "" {
			return "", "", false
		}
		i := strings.LastIndexByte(rest, '.')
		if i <= 0 || i == len(rest)-1 {
			return "", "", false
		}
		return rest[i+1:], rest[:i], true
	}
	if id.DNSName != "" {
		return "", "", false
	}
	sid, err := id.SPIFFE()
	if err != nil || sid.TrustDomain() != s.td {
		return "", "", false
	}
	seg := strings.Split(strings.TrimPrefix(sid.Path(), "/"), "/")
	if len(seg) != 4 || seg[0] != "ns" || seg[2] != "sa" {
		return "", "", false
	}
	return seg[1], seg[3], true
}

// Renewal is the scheme's renewal policy: Istio renews at half the
// life; Linkerd at 70 % of it, clamped to [10s, 24h] after receipt.
func (s Scheme) Renewal() Renewal {
	if s.linkerd {
		return linkerdRenewal
	}
	return istioRenewal
}

// TokenAudience is the audience of the service-account tokens the CA accepts.
func (s Scheme) TokenAudience() string {
	if s.linkerd {
		return LinkerdAudience
	}
	return IstioAudience
}

// CAServerName is the TLS name the CA presents: for Linkerd,
// linkerd-identity.<ns>.serviceaccount.identity.<ns>.<trust domain> with
// <ns> its control namespace; for Istio "", since istiod's name comes from
// the configuration (ISTIOD_SAN) or the address dialled.
func (s Scheme) CAServerName() string {
	if !s.linkerd {
		return ""
	}
	return "linkerd-identity." + s.controlNS + linkerdSuffix(s.td.Name(), s.controlNS)
}

// isDNSLabel reports whether v is an RFC 1123 label: 1-63 lower-case letters,
// digits and '-', starting and ending with a letter or digit.
func isDNSLabel(v string) bool {
	if v == "" || len(v) > 63 || v[0] == '-' || v[len(v)-1] == '-' {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

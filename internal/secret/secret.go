package secret

import (
	"context"
	"crypto/x509"
	"errors"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
)

// Resource names served over SDS (docs/architecture.md).
const (
	// WorkloadCertName is the workload certificate and key (TlsCertificate).
	WorkloadCertName = "default"
	// RootCertName is the trust bundle (ValidationContext).
	RootCertName = "ROOTCA"
	// FileCertPrefix starts "file-cert:<cert-path>~<key-path>".
	FileCertPrefix = "file-cert:"
	// FileRootPrefix starts "file-root:<path>" and "file-root:system".
	FileRootPrefix = "file-root:"
)

// ErrUnknownResource is wrapped by errors for a resource name the manager
// cannot serve; SDS answers them with InvalidArgument.
var ErrUnknownResource = errors.New("unknown resource")

// Secret is one SDS resource as held in memory. A Secret is never modified after
// it is published; a rotation publishes a new one.
type Secret struct {
	// Name is the SDS resource name.
	Name string
	// Identity is the workload identity of a certificate secret; zero for roots.
	Identity pki.Identity
	// CertChain is the PEM chain, leaf first; nil for a root secret.
	CertChain []byte
	// PrivateKey is the PKCS#8 PEM key; nil for a root secret.
	PrivateKey []byte
	// Roots is the PEM trust bundle; set for ROOTCA and file-root secrets.
	Roots []byte
	// Bundle is the parsed trust bundle of which Roots is the PEM; set
	// with it (RootSecret).
	Bundle *pki.Bundle
	// CRL is the PEM revocation lists served with ROOTCA; nil for none.
	CRL []byte
	// Leaf is the parsed leaf of CertChain; nil for a root secret.
	Leaf *x509.Certificate
	// NotAfter is the leaf's expiry (for roots, the earliest root expiry).
	NotAfter time.Time
	// RenewAt is when the manager will replace it; zero when it does not renew it.
	RenewAt time.Time
	// Source says where it came from: "ca", "dev-ca", "file", "output-certs".
	Source string
	// Version increases with every publication of any secret, so a newer
	// secret always has a larger version.
	Version uint64
}

// IsRoot reports whether s is a trust bundle rather than a certificate and key.
func (s *Secret) IsRoot() bool { return s.CertChain == nil }

// CertSecret is the one conversion of a certificate chain (leaf first) and
// its PKCS#8 PEM key into a secret named name: the chain re-encoded as PEM,
// the leaf, its expiry, and the identity the leaf names (zero when it names
// none). Callers that know the identity (a verified CA answer) or the
// renewal time set them on the result before publishing it.
func CertSecret(name string, chain []*x509.Certificate, keyPEM []byte, source string) *Secret {
	leaf := chain[0]
	s := &Secret{
		Name:       name,
		CertChain:  pki.EncodeCertificates(chain),
		PrivateKey: keyPEM,
		Leaf:       leaf,
		NotAfter:   leaf.NotAfter,
		Source:     source,
	}
	if id, err := pki.IdentityOf(leaf); err == nil {
		s.Identity = id
	}
	return s
}

// RootSecret is the one conversion of a trust bundle into a secret named
// name (ROOTCA, file-root:...).
func RootSecret(name string, b *pki.Bundle, source string) *Secret {
	return &Secret{Name: name, Roots: b.PEM(), Bundle: b, NotAfter: b.NotAfter(), Source: source}
}

// SameVersions reports whether secrets are, one for one, the versions in
// sent (what a stream last sent): a stream that reads several names sends
// again only when one of them changed. A nil sent (nothing sent yet) is
// never the same.
func SameVersions(secrets []*Secret, sent []uint64) bool {
	if sent == nil || len(secrets) != len(sent) {
		return false
	}
	for i, sec := range secrets {
		if sec.Version != sent[i] {
			return false
		}
	}
	return true
}

// Provider serves the resource names under a prefix that the secret manager
// does not hold itself (file-cert:..., file-root:...). Its secrets carry the requested
// name.
type Provider interface {
	// Secret returns the current secret for name, waiting for it if needed
	// (bounded by ctx). Names it cannot serve give an error wrapping
	// ErrUnknownResource.
	Secret(ctx context.Context, name string) (*Secret, error)
	// Current returns the secret for name as it is now, never waiting: an
	// error when none is available yet, as Secret's.
	Current(name string) (*Secret, error)
	// Watch signals changes of name on a channel with a one-slot buffer; the
	// function ends the subscription. A nil channel refuses the name (it
	// cannot be loaded, or over a limit); a later Secret may still load it
	// once, so a consumer that watches must refuse the name itself (sds
	// does) rather than serve what it cannot follow.
	Watch(name string) (<-chan struct{}, func())
}

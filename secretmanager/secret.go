package secretmanager

import (
	"crypto/x509"
	"errors"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
)

// Resource names served over SDS (SPEC 9).
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

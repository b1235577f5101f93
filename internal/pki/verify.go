package pki

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Reasons a CA answer is rejected. VerifyIssued wraps one of these, so callers
// can count rejections by reason with errors.Is.
var (
	ErrKeyMismatch      = errors.New("certificate public key does not match the workload key")
	ErrNotValidNow      = errors.New("certificate is not valid now")
	ErrIdentityMismatch = errors.New("certificate identity does not match the requested identity")
	ErrUntrustedChain   = errors.New("certificate chain does not verify to the trusted roots")
	ErrLeafIsCA         = errors.New("certificate is a CA or may sign certificates")
	ErrKeyUsage         = errors.New("certificate lacks the key usages of a workload certificate")
)

// Reason returns a short, metric-label-safe name for an error from VerifyIssued.
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrKeyMismatch):
		return "key_mismatch"
	case errors.Is(err, ErrNotValidNow):
		return "not_valid_now"
	case errors.Is(err, ErrIdentityMismatch):
		return "identity_mismatch"
	case errors.Is(err, ErrUntrustedChain):
		return "untrusted_chain"
	case errors.Is(err, ErrLeafIsCA):
		return "leaf_is_ca"
	case errors.Is(err, ErrKeyUsage):
		return "key_usage"
	case errors.Is(err, ErrNoCertificates):
		return "empty"
	default:
		return "malformed"
	}
}

// MaxClockSkew is how far a leaf's NotBefore may lie ahead of the local clock
// and still be accepted by VerifyIssued. CAs that do not backdate (istiod
// backdates by a minute, others do not) issue certificates that start "now"
// on their own clock, which may run a little ahead of ours. The chain is
// verified at max(now, NotBefore) within this allowance; NotAfter gets none.
const MaxClockSkew = time.Minute

// VerifyIssued checks a chain (leaf first) returned by a CA before it is used:
// the leaf's key is pub, it is valid at now (its NotBefore may be up to
// MaxClockSkew ahead), its only SAN is exactly id, it is a workload
// certificate (CheckWorkloadUsage), and it chains to roots through the
// intermediates in the chain. A root that the CA appended to the chain is
// ignored unless it is also in roots.
func VerifyIssued(chain []*x509.Certificate, pub crypto.PublicKey, id Identity, roots *x509.CertPool, now time.Time) error {
	if len(chain) == 0 {
		return ErrNoCertificates
	}
	leaf := chain[0]
	if !PublicKeysEqual(pub, leaf.PublicKey) {
		return ErrKeyMismatch
	}
	if now.Add(MaxClockSkew).Before(leaf.NotBefore) || !now.Before(leaf.NotAfter) {
		return fmt.Errorf("%w: valid from %s to %s", ErrNotValidNow, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if err := checkIdentity(leaf, id); err != nil {
		return err
	}
	if err := CheckWorkloadUsage(leaf); err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	at := now
	if at.Before(leaf.NotBefore) {
		at = leaf.NotBefore // within MaxClockSkew, checked above
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   at,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUntrustedChain, err)
	}
	return nil
}

// CheckWorkloadUsage refuses a leaf that is not a workload certificate, as
// docs/trust.md ("What a CA answer must be") states after the SPIFFE X509-SVID
// profile (section 4): a leaf that is a CA (basic constraints cA) or may sign
// certificates or CRLs (keyCertSign, cRLSign) would let the workload mint any
// mesh identity, so it wraps ErrLeafIsCA; a leaf without the digitalSignature
// key usage (absent key usage included) cannot sign a TLS handshake, and one
// whose extended key usages, when present, lack either serverAuth or
// clientAuth cannot serve both ends of mutual TLS: ErrKeyUsage. anyExtendedKeyUsage
// stands for both. keyEncipherment and keyAgreement are allowed (istiod sets
// keyEncipherment on every leaf).
func CheckWorkloadUsage(leaf *x509.Certificate) error {
	if leaf.IsCA {
		return fmt.Errorf("%w: basic constraints say cA", ErrLeafIsCA)
	}
	if leaf.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign) != 0 {
		return fmt.Errorf("%w: key usage includes keyCertSign or cRLSign", ErrLeafIsCA)
	}
	if leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		return fmt.Errorf("%w: no digitalSignature key usage", ErrKeyUsage)
	}
	if len(leaf.ExtKeyUsage) == 0 && len(leaf.UnknownExtKeyUsage) == 0 {
		return nil
	}
	var server, client bool
	for _, u := range leaf.ExtKeyUsage {
		switch u {
		case x509.ExtKeyUsageAny:
			server, client = true, true
		case x509.ExtKeyUsageServerAuth:
			server = true
		case x509.ExtKeyUsageClientAuth:
			client = true
		}
	}
	if !server || !client {
		return fmt.Errorf("%w: extended key usage lacks serverAuth or clientAuth", ErrKeyUsage)
	}
	return nil
}

// IdentityOf returns the identity a leaf certificate names: its only URI SAN,
// which must be a SPIFFE ID, else its only DNS SAN.
func IdentityOf(leaf *x509.Certificate) (Identity, error) {
	switch {
	case len(leaf.URIs) == 1 && len(leaf.DNSNames) == 0:
		id, err := spiffeid.FromURI(leaf.URIs[0])
		if err != nil {
			return Identity{}, fmt.Errorf("%w: URI SAN %q is not a SPIFFE ID: %v", ErrIdentityMismatch, leaf.URIs[0], err)
		}
		return Identity{SPIFFEID: id.String()}, nil
	case len(leaf.URIs) == 0 && len(leaf.DNSNames) == 1:
		return Identity{DNSName: leaf.DNSNames[0]}, nil
	}
	return Identity{}, fmt.Errorf("%w: certificate has %d URI and %d DNS names, want exactly one", ErrIdentityMismatch, len(leaf.URIs), len(leaf.DNSNames))
}

func checkIdentity(leaf *x509.Certificate, want Identity) error {
	got, err := IdentityOf(leaf)
	if err != nil {
		return err
	}
	if len(leaf.IPAddresses) != 0 || len(leaf.EmailAddresses) != 0 {
		return fmt.Errorf("%w: certificate carries IP or email names", ErrIdentityMismatch)
	}
	if !got.Matches(want) {
		return fmt.Errorf("%w: got %s, want %s", ErrIdentityMismatch, got, want)
	}
	return nil
}

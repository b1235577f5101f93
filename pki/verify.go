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
	case errors.Is(err, ErrNoCertificates):
		return "empty"
	default:
		return "malformed"
	}
}

// VerifyIssued checks a chain (leaf first) returned by a CA before it is used:
// the leaf's key is pub, it is valid at now, its only SAN is exactly id, and it
// chains to roots through the intermediates in the chain. A root that the CA
// appended to the chain is ignored unless it is also in roots.
func VerifyIssued(chain []*x509.Certificate, pub crypto.PublicKey, id Identity, roots *x509.CertPool, now time.Time) error {
	if len(chain) == 0 {
		return ErrNoCertificates
	}
	leaf := chain[0]
	if !PublicKeysEqual(pub, leaf.PublicKey) {
		return ErrKeyMismatch
	}
	if now.Before(leaf.NotBefore) || !now.Before(leaf.NotAfter) {
		return fmt.Errorf("%w: valid from %s to %s", ErrNotValidNow, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if err := checkIdentity(leaf, id); err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUntrustedChain, err)
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

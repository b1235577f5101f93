package secretmanager

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
)

// Bundle is a parsed trust bundle. It is never modified after it is made; a
// root change makes a new Bundle.
type Bundle struct {
	// PEM is the bundle as served in ROOTCA.
	PEM []byte
	// Certs are the parsed roots, in file order.
	Certs []*x509.Certificate
	// Pool holds Certs, for chain verification.
	Pool *x509.CertPool
	// NotAfter is the earliest expiry of the roots.
	NotAfter time.Time
	// Source says where the bundle came from (a file path, "dev-ca", ...).
	Source string
	// CRL is the PEM certificate revocation lists served with the bundle
	// in ROOTCA (nil: none). Roots.SetCRL sets it; Set keeps it.
	CRL []byte
}

// ParseBundle parses a PEM bundle of one or more certificates. Anything else
// in the data (other block types, trailing garbage) is an error.
func ParseBundle(data []byte, source string) (*Bundle, error) {
	certs, err := pki.ParseCertificates(data)
	if err != nil {
		return nil, fmt.Errorf("parsing trust bundle: %w", err)
	}
	b := &Bundle{
		PEM:    pki.EncodeCertificates(certs),
		Certs:  certs,
		Pool:   pki.CertPool(certs),
		Source: source,
	}
	for i, c := range certs {
		if i == 0 || c.NotAfter.Before(b.NotAfter) {
			b.NotAfter = c.NotAfter
		}
	}
	return b, nil
}

// RootSource gives the trust bundle in force now and signals when it changes.
// The manager serves it as ROOTCA and verifies every CA answer against it.
type RootSource interface {
	// Bundle returns the current bundle; never nil.
	Bundle() *Bundle
	// Watch returns a channel that receives a value after each change (signals
	// merge) and a function that ends the subscription.
	Watch() (<-chan struct{}, func())
}

// Roots is a RootSource whose bundle is replaced with Set, for root files that
// are watched at run time. It also satisfies caclient.RootSource, so the same
// value can verify the CA's TLS certificate. Safe for concurrent use.
type Roots struct {
	mu  sync.Mutex
	b   *Bundle
	hub hub
}

// NewRoots parses the initial bundle.
func NewRoots(pemData []byte, source string) (*Roots, error) {
	b, err := ParseBundle(pemData, source)
	if err != nil {
		return nil, err
	}
	return &Roots{b: b}, nil
}

// Set replaces the bundle. On a parse error the previous bundle stays and the
// error is returned. Setting the same certificates again signals nothing.
func (r *Roots) Set(pemData []byte, source string) error {
	b, err := ParseBundle(pemData, source)
	if err != nil {
		return err
	}
	r.mu.Lock()
	same := bytes.Equal(r.b.PEM, b.PEM)
	if !same {
		b.CRL = r.b.CRL
		r.b = b
	}
	r.mu.Unlock()
	if !same {
		r.hub.notify("")
	}
	return nil
}

// SetCRL replaces the revocation lists served with the bundle (PEM, as
// checked by the caller; nil: none). Setting the same bytes again signals
// nothing.
func (r *Roots) SetCRL(crl []byte) {
	r.mu.Lock()
	same := bytes.Equal(r.b.CRL, crl)
	if !same {
		b := *r.b
		b.CRL = crl
		r.b = &b
	}
	r.mu.Unlock()
	if !same {
		r.hub.notify("")
	}
}

// Bundle returns the current bundle.
func (r *Roots) Bundle() *Bundle {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.b
}

// Roots returns the current pool (caclient.RootSource).
func (r *Roots) Roots() *x509.CertPool { return r.Bundle().Pool }

// Watch subscribes to changes.
func (r *Roots) Watch() (<-chan struct{}, func()) { return r.hub.watch("") }

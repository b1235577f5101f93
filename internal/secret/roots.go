package secret

import (
	"bytes"
	"crypto/x509"
	"sync"

	"github.com/meshagent/meshagent/internal/pki"
)

// RootSource gives the trust bundle in force now and signals when it changes.
// The manager serves it as ROOTCA and verifies every CA answer against it.
type RootSource interface {
	// Bundle returns the current bundle (never nil) and where it came from
	// (a file path, "dev-ca", ...).
	Bundle() (b *pki.Bundle, source string)
	// CRL returns the PEM certificate revocation lists served with the
	// bundle in ROOTCA; nil for none.
	CRL() []byte
	// Watch returns a channel that receives a value after each change (signals
	// merge) and a function that ends the subscription.
	Watch() (<-chan struct{}, func())
}

// Roots is a RootSource whose bundle is replaced at run time (root files
// that are watched). It also satisfies controlplane.RootSource, so the same
// value can verify the CA's TLS certificate. Safe for concurrent use.
type Roots struct {
	mu     sync.Mutex
	b      *pki.Bundle
	source string
	crl    []byte
	hub    hub
}

// NewRoots parses the initial bundle from PEM (roots that arrive as PEM:
// the development CA's, a test's).
func NewRoots(pemData []byte, source string) (*Roots, error) {
	b, err := pki.ParseBundle(pemData)
	if err != nil {
		return nil, err
	}
	return RootsOf(b, source), nil
}

// RootsOf holds a bundle parsed already (root files: certfile.RootFeed).
func RootsOf(b *pki.Bundle, source string) *Roots {
	return &Roots{b: b, source: source}
}

// Set parses PEM roots and replaces the bundle with them (see SetBundle).
// On a parse error the previous bundle stays and the error is returned.
func (r *Roots) Set(pemData []byte, source string) error {
	b, err := pki.ParseBundle(pemData)
	if err != nil {
		return err
	}
	r.SetBundle(b, source)
	return nil
}

// SetBundle replaces the bundle. Setting the same certificates again
// signals nothing; a nil bundle is ignored.
func (r *Roots) SetBundle(b *pki.Bundle, source string) {
	if b == nil {
		return
	}
	r.mu.Lock()
	same := r.b.Equal(b)
	if !same {
		r.b, r.source = b, source
	}
	r.mu.Unlock()
	if !same {
		r.hub.notify()
	}
}

// SetCRL replaces the revocation lists served with the bundle (PEM, as
// checked by the caller; nil: none). They are kept apart from the bundle,
// so a new bundle keeps them. Setting the same bytes again signals nothing.
func (r *Roots) SetCRL(crl []byte) {
	r.mu.Lock()
	same := bytes.Equal(r.crl, crl)
	if !same {
		r.crl = crl
	}
	r.mu.Unlock()
	if !same {
		r.hub.notify()
	}
}

// CRL returns the revocation lists set by SetCRL; nil for none.
func (r *Roots) CRL() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.crl
}

// Bundle returns the current bundle and its source.
func (r *Roots) Bundle() (*pki.Bundle, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.b, r.source
}

// Roots returns the current pool (controlplane.RootSource).
func (r *Roots) Roots() *x509.CertPool {
	b, _ := r.Bundle()
	return b.Pool()
}

// Watch subscribes to changes.
func (r *Roots) Watch() (<-chan struct{}, func()) { return r.hub.watch() }

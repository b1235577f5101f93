package pki

import (
	"bytes"
	"crypto/x509"
	"time"
)

// Bundle is a trust bundle: a set of root certificates, parsed once where
// it enters the agent (a root file, the system bundle, the development CA)
// and passed on as is, never re-parsed from PEM on the way. It is never
// modified after it is made; new roots make a new Bundle. The nil *Bundle
// holds no roots.
type Bundle struct {
	certs    []*x509.Certificate
	pem      []byte
	pool     *x509.CertPool
	notAfter time.Time
}

// NewBundle makes a bundle of certs, in that order. certs must not be
// modified afterwards.
func NewBundle(certs []*x509.Certificate) *Bundle {
	b := &Bundle{certs: certs, pem: EncodeCertificates(certs), pool: CertPool(certs)}
	for i, c := range certs {
		if i == 0 || c.NotAfter.Before(b.notAfter) {
			b.notAfter = c.NotAfter
		}
	}
	return b
}

// ParseBundle parses a PEM bundle of one or more certificates. It is strict
// (see ParseCertificates): anything else in the data is an error, so a
// truncated file is never taken for a smaller bundle.
func ParseBundle(data []byte) (*Bundle, error) {
	certs, err := ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	return NewBundle(certs), nil
}

// Certs returns the roots in their original order. The slice is shared:
// callers must not modify it.
func (b *Bundle) Certs() []*x509.Certificate {
	if b == nil {
		return nil
	}
	return b.certs
}

// PEM returns the roots re-encoded as PEM CERTIFICATE blocks (whatever
// else the source held is dropped). The slice is shared: callers must not
// modify it.
func (b *Bundle) PEM() []byte {
	if b == nil {
		return nil
	}
	return b.pem
}

// Pool returns the roots as a pool for chain verification, made once.
func (b *Bundle) Pool() *x509.CertPool {
	if b == nil {
		return x509.NewCertPool()
	}
	return b.pool
}

// NotAfter returns the earliest expiry among the roots.
func (b *Bundle) NotAfter() time.Time {
	if b == nil {
		return time.Time{}
	}
	return b.notAfter
}

// Equal reports whether b and o hold the same certificates in the same
// order.
func (b *Bundle) Equal(o *Bundle) bool {
	if b == nil || o == nil {
		return b == o
	}
	return b == o || bytes.Equal(b.pem, o.pem)
}

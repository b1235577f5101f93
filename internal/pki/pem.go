package pki

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// ErrNoCertificates is returned when a bundle holds no certificate.
var ErrNoCertificates = errors.New("no certificates found")

// ParseCertificates parses a PEM bundle of one or more CERTIFICATE blocks.
// Anything else in the data (other block types, bytes that are not PEM, a block
// that does not parse) is an error naming what was wrong and where.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := data
	for i := 0; ; i++ {
		trimmed := bytes.TrimSpace(rest)
		if len(trimmed) == 0 {
			break
		}
		block, r := pem.Decode(trimmed)
		if block == nil {
			return nil, fmt.Errorf("certificate %d: data is not PEM", i)
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("certificate %d: PEM block type %q, want CERTIFICATE", i, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", i, err)
		}
		certs = append(certs, c)
		rest = r
	}
	if len(certs) == 0 {
		return nil, ErrNoCertificates
	}
	return certs, nil
}

// ParseCertificatesDER parses a list of DER certificates.
func ParseCertificatesDER(ders ...[]byte) ([]*x509.Certificate, error) {
	if len(ders) == 0 {
		return nil, ErrNoCertificates
	}
	certs := make([]*x509.Certificate, 0, len(ders))
	for i, der := range ders {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", i, err)
		}
		certs = append(certs, c)
	}
	return certs, nil
}

// EncodeCertificates encodes certificates as concatenated PEM CERTIFICATE blocks.
func EncodeCertificates(certs []*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return buf.Bytes()
}

// CertPool returns a pool holding certs.
func CertPool(certs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

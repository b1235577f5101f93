package certfile

import (
	"bytes"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/meshagent/meshagent/internal/files/regularfile"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
)

// Pair is a certificate chain and the private key of its leaf.
type Pair struct {
	// Chain is the parsed chain, leaf first.
	Chain []*x509.Certificate
	// Key is the leaf's private key.
	Key crypto.Signer
	// ChainPEM is Chain re-encoded as PEM (anything else the file held is
	// dropped).
	ChainPEM []byte
	// KeyPEM is Key encoded as PKCS#8 PEM, whatever form the file used.
	KeyPEM []byte
}

// Leaf returns the first certificate of the chain.
func (p *Pair) Leaf() *x509.Certificate { return p.Chain[0] }

// Equal reports whether p and o hold the same chain and key.
func (p *Pair) Equal(o *Pair) bool {
	if p == nil || o == nil {
		return p == o
	}
	return bytes.Equal(p.ChainPEM, o.ChainPEM) && bytes.Equal(p.KeyPEM, o.KeyPEM)
}

// Secret returns the pair as the secret named name
// (secret.CertSecret).
func (p *Pair) Secret(name, source string) *secret.Secret {
	return secret.CertSecret(name, p.Chain, p.KeyPEM, source)
}

// TLSCertificate returns the pair for use in a tls.Config.
func (p *Pair) TLSCertificate() *tls.Certificate {
	c := &tls.Certificate{PrivateKey: p.Key, Leaf: p.Chain[0]}
	for _, cert := range p.Chain {
		c.Certificate = append(c.Certificate, cert.Raw)
	}
	return c
}

// ParsePair parses a PEM chain (leaf first) and a PEM private key and checks
// that the key belongs to the leaf and that the leaf has not expired at now.
// The errors wrap pki.ErrKeyMismatch and pki.ErrNotValidNow where they apply.
func ParsePair(chainPEM, keyPEM []byte, now time.Time) (*Pair, error) {
	chain, err := pki.ParseCertificates(chainPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate chain: %w", err)
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("private key: %w", err)
	}
	leaf := chain[0]
	if !pki.PublicKeysEqual(key.Public(), leaf.PublicKey) {
		return nil, pki.ErrKeyMismatch
	}
	if !now.Before(leaf.NotAfter) {
		return nil, fmt.Errorf("%w: expired at %s", pki.ErrNotValidNow, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	normKey, err := pki.EncodeKeyPEM(key)
	if err != nil {
		return nil, err
	}
	return &Pair{Chain: chain, Key: key, ChainPEM: pki.EncodeCertificates(chain), KeyPEM: normKey}, nil
}

// LoadPair reads and parses a chain file and a key file (see ParsePair).
func LoadPair(certPath, keyPath string, now time.Time) (*Pair, error) {
	return loadPair(nil, certPath, keyPath, now)
}

// loadPair is LoadPair with the files opened by open (nil: by path).
func loadPair(open func(string) (*os.File, error), certPath, keyPath string, now time.Time) (*Pair, error) {
	chainPEM, err := regularfile.ReadWith(open, certPath, 0)
	if err != nil {
		return nil, fmt.Errorf("reading certificate chain: %w", err)
	}
	keyPEM, err := regularfile.ReadWith(open, keyPath, 0)
	if err != nil {
		return nil, fmt.Errorf("reading private key: %w", err)
	}
	p, err := ParsePair(chainPEM, keyPEM, now)
	if err != nil {
		return nil, fmt.Errorf("%s and %s: %w", certPath, keyPath, err)
	}
	return p, nil
}

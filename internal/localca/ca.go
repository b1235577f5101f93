package localca

import (
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
)

// Config describes a CA. Zero values get the defaults noted on each field.
type Config struct {
	// Name is the root's common name. Default "meshagent local CA".
	Name string
	// KeyType of the CA keys. Default pki.ECP256.
	KeyType pki.KeyType
	// Lifetime of the root. Default 10 years.
	Lifetime time.Duration
	// Intermediate makes the root sign an intermediate that issues the leaves.
	Intermediate bool
	// Now is the clock used for validity periods. Default time.Now.
	Now func() time.Time
}

// CA issues certificates from an in-memory root.
type CA struct {
	now       func() time.Time
	root      *x509.Certificate
	issuer    *x509.Certificate
	key       crypto.Signer
	chainTail []*x509.Certificate // intermediates then root, appended to every leaf chain
}

// New makes a CA with a fresh root key.
func New(cfg Config) (*CA, error) {
	if cfg.Name == "" {
		cfg.Name = "meshagent local CA"
	}
	if cfg.Lifetime == 0 {
		cfg.Lifetime = 10 * 365 * 24 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	rootKey, err := pki.GenerateKey(cfg.KeyType)
	if err != nil {
		return nil, err
	}
	now := cfg.Now()
	rootTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: cfg.Name, Organization: []string{"meshagent"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(cfg.Lifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	root, err := create(rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	if err != nil {
		return nil, fmt.Errorf("creating root: %w", err)
	}
	ca := &CA{now: cfg.Now, root: root, issuer: root, key: rootKey, chainTail: []*x509.Certificate{root}}
	if !cfg.Intermediate {
		return ca, nil
	}
	interKey, err := pki.GenerateKey(cfg.KeyType)
	if err != nil {
		return nil, err
	}
	interTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: cfg.Name + " intermediate", Organization: []string{"meshagent"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(cfg.Lifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	inter, err := create(interTmpl, root, interKey.Public(), rootKey)
	if err != nil {
		return nil, fmt.Errorf("creating intermediate: %w", err)
	}
	ca.issuer, ca.key, ca.chainTail = inter, interKey, []*x509.Certificate{inter, root}
	return ca, nil
}

// Root returns the root certificate.
func (ca *CA) Root() *x509.Certificate { return ca.root }

// RootPEM returns the root certificate in PEM.
func (ca *CA) RootPEM() []byte { return pki.EncodeCertificates([]*x509.Certificate{ca.root}) }

// Pool returns a pool holding only the root.
func (ca *CA) Pool() *x509.CertPool { return pki.CertPool([]*x509.Certificate{ca.root}) }

// Leaf describes a certificate to issue.
type Leaf struct {
	PublicKey crypto.PublicKey
	// Identity becomes the URI SAN (SPIFFE ID) or a DNS SAN.
	Identity pki.Identity
	// DNSNames, IPs and URIs are added as further SANs (for TLS server certificates).
	DNSNames []string
	IPs      []net.IP
	URIs     []*url.URL
	// NotBefore defaults to now minus one minute; NotAfter to NotBefore + TTL.
	NotBefore, NotAfter time.Time
	// TTL is used when NotAfter is zero. Default 24h.
	TTL time.Duration
	// Edit, when set, changes the leaf's template just before it is signed:
	// how a test makes a CA that misissues (a leaf that is a CA, other key
	// usages). The CA's own leaves are workload certificates as
	// docs/trust.md describes them.
	Edit func(tmpl *x509.Certificate)
}

// Issue signs a leaf and returns its chain: leaf, intermediates, root.
func (ca *CA) Issue(l Leaf) ([]*x509.Certificate, error) {
	now := ca.now()
	if l.NotBefore.IsZero() {
		l.NotBefore = now.Add(-time.Minute)
	}
	if l.TTL == 0 {
		l.TTL = 24 * time.Hour
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = now.Add(l.TTL)
	}
	tmpl := &x509.Certificate{
		NotBefore:   l.NotBefore,
		NotAfter:    l.NotAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    l.DNSNames,
		IPAddresses: l.IPs,
		URIs:        l.URIs,
	}
	switch {
	case l.Identity.SPIFFEID != "":
		u, err := l.Identity.URI()
		if err != nil {
			return nil, err
		}
		tmpl.URIs = append([]*url.URL{u}, tmpl.URIs...)
	case l.Identity.DNSName != "":
		tmpl.DNSNames = append([]string{l.Identity.DNSName}, tmpl.DNSNames...)
	}
	if l.Edit != nil {
		l.Edit(tmpl)
	}
	leaf, err := create(tmpl, ca.issuer, l.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("issuing certificate for %s: %w", l.Identity, err)
	}
	return append([]*x509.Certificate{leaf}, ca.chainTail...), nil
}

// SignCSR checks a CSR's signature and issues a certificate for id (not for
// what the CSR asks: like a mesh CA, the identity comes from the caller).
func (ca *CA) SignCSR(csr []byte, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	req, err := pki.ParseCSR(csr)
	if err != nil {
		return nil, err
	}
	return ca.Issue(Leaf{PublicKey: req.PublicKey, Identity: id, TTL: ttl})
}

// ServerTLS returns a TLS certificate for a server answering to the given DNS
// names and IP addresses, with a fresh key.
func (ca *CA) ServerTLS(dnsNames []string, ips []net.IP) (tls.Certificate, error) {
	return ca.TLSCertificate(Leaf{DNSNames: dnsNames, IPs: ips, TTL: 365 * 24 * time.Hour})
}

// TLSCertificate issues l with a fresh key (l.PublicKey is ignored) and
// returns it as a tls.Certificate with the chain.
func (ca *CA) TLSCertificate(l Leaf) (tls.Certificate, error) {
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		return tls.Certificate{}, err
	}
	l.PublicKey = key.Public()
	chain, err := ca.Issue(l)
	if err != nil {
		return tls.Certificate{}, err
	}
	out := tls.Certificate{PrivateKey: key, Leaf: chain[0]}
	for _, c := range chain[:len(chain)-1] {
		out.Certificate = append(out.Certificate, c.Raw)
	}
	return out, nil
}

func create(tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

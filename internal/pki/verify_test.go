package pki_test

import (
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

func verifyOpts(roots *x509.CertPool) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
}

func TestVerifyIssued(t *testing.T) {
	t.Parallel()
	now := nowUTC()
	ca := newCA(t, now)
	other := newCA(t, now)
	key := newKey(t)
	pub := key.Public()
	good := issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, TTL: time.Hour})

	tests := []struct {
		name   string
		chain  []*x509.Certificate
		pub    any
		id     pki.Identity
		roots  *x509.CertPool
		now    time.Time
		want   error
		reason string
	}{
		{"good", good, pub, testID, ca.Pool(), now, nil, ""},
		{"good without the root in the chain", good[:2], pub, testID, ca.Pool(), now, nil, ""},
		{"empty", nil, pub, testID, ca.Pool(), now, pki.ErrNoCertificates, "empty"},
		{"other key", good, newKey(t).Public(), testID, ca.Pool(), now, pki.ErrKeyMismatch, "key_mismatch"},
		{"expired", good, pub, testID, ca.Pool(), now.Add(2 * time.Hour), pki.ErrNotValidNow, "not_valid_now"},
		{"not yet valid", good, pub, testID, ca.Pool(), now.Add(-time.Hour), pki.ErrNotValidNow, "not_valid_now"},
		{"starts 30 s ahead: a CA clock within the skew allowance", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, NotBefore: now.Add(30 * time.Second), NotAfter: now.Add(time.Hour)}), pub, testID, ca.Pool(), now, nil, ""},
		{"starts just within the skew allowance", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, NotBefore: now.Add(pki.MaxClockSkew), NotAfter: now.Add(time.Hour)}), pub, testID, ca.Pool(), now, nil, ""},
		{"starts beyond the skew allowance", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, NotBefore: now.Add(pki.MaxClockSkew + time.Second), NotAfter: now.Add(time.Hour)}), pub, testID, ca.Pool(), now, pki.ErrNotValidNow, "not_valid_now"},
		{"other identity", good, pub, pki.SPIFFEIdentity("cluster.local", "shop", "db"), ca.Pool(), now, pki.ErrIdentityMismatch, "identity_mismatch"},
		{"foreign root", good, pub, testID, other.Pool(), now, pki.ErrUntrustedChain, "untrusted_chain"},
		{"root appended by a foreign CA is ignored", append(issue(t, other, localca.Leaf{PublicKey: pub, Identity: testID}), ca.Root()), pub, testID, ca.Pool(), now, pki.ErrUntrustedChain, "untrusted_chain"},
		{"missing intermediate", good[:1], pub, testID, ca.Pool(), now, pki.ErrUntrustedChain, "untrusted_chain"},
		{"extra DNS SAN", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, DNSNames: []string{"web.shop"}}), pub, testID, ca.Pool(), now, pki.ErrIdentityMismatch, "identity_mismatch"},
		{"extra IP SAN", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, IPs: []net.IP{loopbackIP}}), pub, testID, ca.Pool(), now, pki.ErrIdentityMismatch, "identity_mismatch"},
		{"two URIs", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, URIs: []*url.URL{mustURL(t, "spiffe://cluster.local/x")}}), pub, testID, ca.Pool(), now, pki.ErrIdentityMismatch, "identity_mismatch"},
		{"DNS identity", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: pki.Identity{DNSName: "web.shop.serviceaccount.identity.linkerd.cluster.local"}}), pub, pki.Identity{DNSName: "web.shop.serviceaccount.identity.linkerd.cluster.local"}, ca.Pool(), now, nil, ""},
		// A URI SAN that only looks like the request: not a SPIFFE ID (trailing
		// slash, upper-case trust domain), even when the request says the same.
		{"URI SAN not a SPIFFE ID", issue(t, ca, localca.Leaf{PublicKey: pub, URIs: []*url.URL{mustURL(t, "spiffe://cluster.local/ns/shop/sa/web/")}}), pub, pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/shop/sa/web/"}, ca.Pool(), now, pki.ErrIdentityMismatch, "identity_mismatch"},
		{"upper-case trust domain", issue(t, ca, localca.Leaf{PublicKey: pub, URIs: []*url.URL{mustURL(t, "spiffe://Cluster.Local/ns/shop/sa/web")}}), pub, pki.Identity{SPIFFEID: "spiffe://Cluster.Local/ns/shop/sa/web"}, ca.Pool(), now, pki.ErrIdentityMismatch, "identity_mismatch"},
		{"leaf is a CA", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.IsCA, c.BasicConstraintsValid = true, true }}), pub, testID, ca.Pool(), now, pki.ErrLeafIsCA, "leaf_is_ca"},
		{"leaf may sign certificates", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageCertSign }}), pub, testID, ca.Pool(), now, pki.ErrLeafIsCA, "leaf_is_ca"},
		{"leaf may sign CRLs", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageCRLSign }}), pub, testID, ca.Pool(), now, pki.ErrLeafIsCA, "leaf_is_ca"},
		{"basic constraints present, not a CA", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.BasicConstraintsValid = true }}), pub, testID, ca.Pool(), now, nil, ""},
		{"no key usage at all", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.KeyUsage = 0 }}), pub, testID, ca.Pool(), now, pki.ErrKeyUsage, "key_usage"},
		{"no digitalSignature", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageKeyEncipherment }}), pub, testID, ca.Pool(), now, pki.ErrKeyUsage, "key_usage"},
		{"digitalSignature alone", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature }}), pub, testID, ca.Pool(), now, nil, ""},
		{"serverAuth only", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} }}), pub, testID, ca.Pool(), now, pki.ErrKeyUsage, "key_usage"},
		{"clientAuth only", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth} }}), pub, testID, ca.Pool(), now, pki.ErrKeyUsage, "key_usage"},
		{"code signing only", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning} }}), pub, testID, ca.Pool(), now, pki.ErrKeyUsage, "key_usage"},
		{"any extended key usage", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageAny} }}), pub, testID, ca.Pool(), now, nil, ""},
		{"no extended key usage", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: testID, Edit: func(c *x509.Certificate) { c.ExtKeyUsage = nil }}), pub, testID, ca.Pool(), now, nil, ""},
		{"DNS cert for a SPIFFE request", issue(t, ca, localca.Leaf{PublicKey: pub, Identity: pki.Identity{DNSName: "web"}}), pub, testID, ca.Pool(), now, pki.ErrIdentityMismatch, "identity_mismatch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := pki.VerifyIssued(tt.chain, tt.pub, tt.id, tt.roots, tt.now)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("error %v, want %v", err, tt.want)
			}
			if got := pki.Reason(err); got != tt.reason {
				t.Errorf("Reason = %q, want %q", got, tt.reason)
			}
		})
	}
	if pki.Reason(nil) != "" || pki.Reason(errors.New("x")) != "malformed" {
		t.Error("Reason of nil / other errors")
	}
}

func TestIdentityOf(t *testing.T) {
	t.Parallel()
	ca := newCA(t, nowUTC())
	leaf := issue(t, ca, localca.Leaf{PublicKey: newKey(t).Public(), Identity: testID})[0]
	if id, err := pki.IdentityOf(leaf); err != nil || id != testID {
		t.Errorf("%v %v", id, err)
	}
	if _, err := pki.IdentityOf(ca.Root()); !errors.Is(err, pki.ErrIdentityMismatch) {
		t.Errorf("root without SAN: %v", err)
	}
}

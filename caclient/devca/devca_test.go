package devca

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

var spiffeID = pki.SPIFFEIdentity("cluster.local", "ns1", "sa1")

func newClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func csrFor(t *testing.T, id pki.Identity) ([]byte, any) {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	der, err := pki.NewCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	return der, key.Public()
}

func TestSignIssuesVerifiableCertificate(t *testing.T) {
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, Config{CA: ca})
	for _, id := range []pki.Identity{spiffeID, pki.LinkerdIdentity("cluster.local", "ns1", "sa1", "linkerd")} {
		t.Run(id.String(), func(t *testing.T) {
			csr, pub := csrFor(t, id)
			chain, err := c.Sign(context.Background(), csr, id, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if len(chain) != 3 {
				t.Fatalf("chain has %d certificates, want leaf, intermediate, root", len(chain))
			}
			if err := pki.VerifyIssued(chain, pub, id, ca.Pool(), time.Now()); err != nil {
				t.Fatal(err)
			}
			if life := chain[0].NotAfter.Sub(time.Now()); life > time.Hour || life < 59*time.Minute {
				t.Errorf("lifetime %s, want about 1h", life)
			}
		})
	}
	if got := c.Requests(); got != 2 {
		t.Errorf("Requests() = %d, want 2", got)
	}
}

func TestSignCapsTTL(t *testing.T) {
	c := newClient(t, Config{MaxTTL: 10 * time.Minute})
	csr, _ := csrFor(t, spiffeID)
	chain, err := c.Sign(context.Background(), csr, spiffeID, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if life := time.Until(chain[0].NotAfter); life > 10*time.Minute {
		t.Errorf("lifetime %s exceeds the 10m cap", life)
	}
	chain, err = c.Sign(context.Background(), csr, spiffeID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if life := time.Until(chain[0].NotAfter); life > 10*time.Minute {
		t.Errorf("default lifetime %s exceeds the 10m cap", life)
	}
}

func TestSignRefusesBadCSR(t *testing.T) {
	c := newClient(t, Config{})
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(spiffeID.SPIFFEID)
	other, _ := url.Parse("spiffe://cluster.local/ns/ns1/sa/other")
	raw := func(tmpl *x509.CertificateRequest) []byte {
		der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	good, _ := csrFor(t, spiffeID)
	tests := []struct {
		name string
		csr  []byte
		id   pki.Identity
	}{
		{"other identity", raw(&x509.CertificateRequest{URIs: []*url.URL{other}}), spiffeID},
		{"extra DNS name", raw(&x509.CertificateRequest{URIs: []*url.URL{u}, DNSNames: []string{"x.example"}}), spiffeID},
		{"two URIs", raw(&x509.CertificateRequest{URIs: []*url.URL{u, other}}), spiffeID},
		{"common name", raw(&x509.CertificateRequest{Subject: pkix.Name{CommonName: "sa1"}, URIs: []*url.URL{u}}), spiffeID},
		{"email", raw(&x509.CertificateRequest{URIs: []*url.URL{u}, EmailAddresses: []string{"a@b.c"}}), spiffeID},
		{"no SAN", raw(&x509.CertificateRequest{}), spiffeID},
		{"garbage", []byte("not a csr"), spiffeID},
		{"invalid identity", good, pki.Identity{SPIFFEID: "http://x"}},
		{"DNS identity with URI SAN", good, pki.Identity{DNSName: "sa1.ns1.serviceaccount.identity.linkerd.cluster.local"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Sign(context.Background(), tt.csr, tt.id, time.Hour)
			if !errors.Is(err, ErrBadCSR) {
				t.Fatalf("Sign error = %v, want ErrBadCSR", err)
			}
		})
	}
}

func TestSignAfterCloseAndCancel(t *testing.T) {
	c := newClient(t, Config{})
	csr, _ := csrFor(t, spiffeID)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Sign(ctx, csr, spiffeID, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sign with cancelled context: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Sign(context.Background(), csr, spiffeID, time.Hour); !errors.Is(err, ErrClosed) {
		t.Fatalf("Sign after Close: %v", err)
	}
	if c.Requests() != 0 {
		t.Errorf("Requests() = %d, want 0", c.Requests())
	}
}

func FuzzSign(f *testing.F) {
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		f.Fatal(err)
	}
	good, err := pki.NewCSR(key, spiffeID)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good, spiffeID.SPIFFEID)
	f.Add(pki.EncodeCSRPEM(good), spiffeID.SPIFFEID)
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x00}, "spiffe://x/y")
	f.Add([]byte(""), "")
	c, err := New(Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, csr []byte, id string) {
		chain, err := c.Sign(context.Background(), csr, pki.Identity{SPIFFEID: id}, time.Hour)
		if err == nil {
			if len(chain) == 0 || chain[0].URIs[0].String() != id {
				t.Fatalf("issued %v for %q", chain, id)
			}
		}
	})
}

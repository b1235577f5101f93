package grpcbootstrap

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshagent/meshagent/localca"
	"github.com/meshagent/meshagent/pki"
)

func rootOf(t *testing.T, kt pki.KeyType) *x509.Certificate {
	t.Helper()
	ca, err := localca.New(localca.Config{KeyType: kt})
	if err != nil {
		t.Fatal(err)
	}
	return ca.Root()
}

func ed25519Root(t *testing.T) *x509.Certificate {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(7),
		Subject:               pkix.Name{CommonName: "ed25519 root"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, crypto.Signer(priv))
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The map parses with go-spiffe, the library grpc-go uses for it, and gives
// back the same roots per trust domain, for every key type a root may have.
func TestBundleMapParsesWithGoSPIFFE(t *testing.T) {
	bundles := map[string][]*x509.Certificate{
		"cluster.local":    {rootOf(t, pki.ECP256), rootOf(t, pki.ECP384), rootOf(t, pki.RSA2048)},
		"partner.example":  {ed25519Root(t)},
		"old-mesh_2.local": {rootOf(t, pki.ECP256)},
	}
	data, err := BundleMap(bundles)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		TrustDomains map[string]json.RawMessage `json:"trust_domains"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.TrustDomains) != len(bundles) {
		t.Fatalf("%d trust domains, want %d", len(m.TrustDomains), len(bundles))
	}
	for td, roots := range bundles {
		b, err := spiffebundle.Parse(spiffeid.RequireTrustDomainFromString(td), m.TrustDomains[td])
		if err != nil {
			t.Fatalf("%s: go-spiffe rejects the bundle: %v", td, err)
		}
		got := b.X509Authorities()
		if len(got) != len(roots) {
			t.Fatalf("%s: %d authorities, want %d", td, len(got), len(roots))
		}
		for i := range roots {
			if !got[i].Equal(roots[i]) {
				t.Fatalf("%s: authority %d differs", td, i)
			}
		}
	}
	again, err := BundleMap(bundles)
	if err != nil || string(again) != string(data) {
		t.Fatal("encoding is not deterministic")
	}
}

func TestBundleMapErrors(t *testing.T) {
	root := rootOf(t, pki.ECP256)
	for name, bundles := range map[string]map[string][]*x509.Certificate{
		"none":                {},
		"no roots":            {"cluster.local": nil},
		"upper case":          {"Cluster.local": {root}},
		"spiffe scheme":       {"spiffe://cluster.local": {root}},
		"empty trust domain":  {"": {root}},
		"port in domain name": {"cluster.local:443": {root}},
	} {
		if _, err := BundleMap(bundles); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestWriteBundleMap(t *testing.T) {
	p := filepath.Join(t.TempDir(), "certs", BundleMapFile)
	bundles := map[string][]*x509.Certificate{"cluster.local": {rootOf(t, pki.ECP256)}}
	if w, err := WriteBundleMap(p, bundles); err != nil || !w {
		t.Fatalf("first write: %v, %v", w, err)
	}
	if w, err := WriteBundleMap(p, bundles); err != nil || w {
		t.Fatalf("unchanged map rewritten: %v, %v", w, err)
	}
	bundles["cluster.local"] = append(bundles["cluster.local"], rootOf(t, pki.ECP256))
	if w, err := WriteBundleMap(p, bundles); err != nil || !w {
		t.Fatalf("changed map not written: %v, %v", w, err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, %v", fi.Mode(), err)
	}
}

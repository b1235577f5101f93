package outputcerts

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"math/big"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

// The bundle map is read back by go-spiffe's SPIFFE bundle parser (the one
// gRPC uses) with the same roots, for EC and RSA roots.
func TestBundleMapParsesAsSPIFFEBundles(t *testing.T) {
	ec := newCA(t)
	rsaCA, err := localca.New(localca.Config{KeyType: pki.RSA2048})
	if err != nil {
		t.Fatal(err)
	}
	roots := []*x509.Certificate{ec.Root(), rsaCA.Root()}
	data, err := BundleMap("cluster.local", roots)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		TrustDomains map[string]json.RawMessage `json:"trust_domains"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	b, err := spiffebundle.Parse(spiffeid.RequireTrustDomainFromString("cluster.local"), m.TrustDomains["cluster.local"])
	if err != nil {
		t.Fatalf("go-spiffe refuses the bundle: %v\n%s", err, data)
	}
	got := b.X509Authorities()
	if len(got) != 2 || !got[0].Equal(roots[0]) || !got[1].Equal(roots[1]) {
		t.Errorf("parsed roots %d, want the two roots in order", len(got))
	}
}

func TestBundleMapRefusesWhatItCannotWrite(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ed"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := BundleMap("cluster.local", []*x509.Certificate{c}); err == nil {
		t.Error("an Ed25519 root was written")
	}
	if _, err := BundleMap("", []*x509.Certificate{newCA(t).Root()}); err == nil {
		t.Error("no trust domain accepted")
	}
}

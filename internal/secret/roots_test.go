package secret

import (
	"bytes"
	"crypto/x509"
	"testing"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

func newCA(t testing.TB, cfg localca.Config) *localca.CA {
	t.Helper()
	ca, err := localca.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestRootsSetSignalsOnlyOnChange(t *testing.T) {
	a := newCA(t, localca.Config{Name: "a"})
	b := newCA(t, localca.Config{Name: "b"})
	r, err := NewRoots(a.RootPEM(), "file")
	if err != nil {
		t.Fatal(err)
	}
	ch, cancel := r.Watch()
	defer cancel()

	if err := r.Set(a.RootPEM(), "file"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		t.Fatal("setting the same roots signalled a change")
	default:
	}
	if err := r.Set([]byte("broken"), "file"); err == nil {
		t.Fatal("Set accepted a broken bundle")
	}
	if cur, _ := r.Bundle(); !bytes.Equal(cur.PEM(), a.RootPEM()) {
		t.Fatal("a broken bundle replaced the good one")
	}
	if err := r.Set(b.RootPEM(), "file"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Fatal("a new bundle was not signalled")
	}
	if cur, source := r.Bundle(); !bytes.Equal(cur.PEM(), b.RootPEM()) || source != "file" {
		t.Fatal("bundle not replaced")
	}
	leafKey, _ := pki.GenerateKey(pki.ECP256)
	chain, err := b.Issue(localca.Leaf{PublicKey: leafKey.Public(), Identity: pki.SPIFFEIdentity("cluster.local", "ns1", "sa1")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: r.Roots(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("Roots() pool does not verify a leaf of the new root: %v", err)
	}
}

func TestRootsSetCRLKeepsItAcrossRootChanges(t *testing.T) {
	a, b := newCA(t, localca.Config{}).RootPEM(), newCA(t, localca.Config{}).RootPEM()
	r, err := NewRoots(a, "a")
	if err != nil {
		t.Fatal(err)
	}
	ch, stop := r.Watch()
	defer stop()
	r.SetCRL([]byte("crl"))
	select {
	case <-ch:
	default:
		t.Fatal("SetCRL did not signal")
	}
	r.SetCRL([]byte("crl"))
	select {
	case <-ch:
		t.Fatal("the same CRL signalled")
	default:
	}
	if err := r.Set(b, "b"); err != nil {
		t.Fatal(err)
	}
	if got, source := r.Bundle(); string(r.CRL()) != "crl" || source != "b" || !bytes.Equal(got.PEM(), b) {
		t.Errorf("after Set: CRL %q source %q", r.CRL(), source)
	}
	r.SetCRL(nil)
	if _, source := r.Bundle(); r.CRL() != nil || source != "b" {
		t.Errorf("after SetCRL(nil): CRL %q source %q", r.CRL(), source)
	}
}

package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

// The dev CA signs a kubelet's stub CSR, which names nothing, for the
// pod's identity and the CSR's key.
func TestLocalCASignerSignsStubCSRs(t *testing.T) {
	ca, err := localca.New(localca.Config{Name: "test", Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	stub, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	id := pki.SPIFFEIdentity("cluster.local", "shop", "web")
	chain, err := localCASigner{ca: ca}.Sign(context.Background(), stub, id, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.VerifyIssued(chain, &key.PublicKey, id, ca.Pool(), time.Now()); err != nil {
		t.Errorf("answer: %v", err)
	}
	if _, err := (localCASigner{ca: ca}).Sign(context.Background(), []byte("not a CSR"), id, time.Hour); err == nil {
		t.Error("signed garbage")
	}
}

package app

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/secretmanager"
)

// The xDS proxy's client certificate is the manager's current workload
// certificate: none before one is held, then each one published, parsed once.
func TestWorkloadCertificate(t *testing.T) {
	ca, err := localca.New(localca.Config{Name: "client cert test root"})
	if err != nil {
		t.Fatal(err)
	}
	roots, err := secret.NewRoots(ca.RootPEM(), "test")
	if err != nil {
		t.Fatal(err)
	}
	m, err := secretmanager.New(secretmanager.Config{Roots: roots, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	get := workloadCertificate(m)
	if c, err := get(); !errors.Is(err, errNoWorkloadCert) || c != nil {
		t.Fatalf("before any certificate: %v, %v", c, err)
	}
	if _, err := workloadCertificate(nil)(); !errors.Is(err, errNoWorkloadCert) {
		t.Fatalf("without a manager: %v", err)
	}
	for i := range 2 {
		key, err := pki.GenerateKey(pki.ECP256)
		if err != nil {
			t.Fatal(err)
		}
		chain, err := ca.Issue(localca.Leaf{PublicKey: key.Public(), Identity: pki.SPIFFEIdentity("cluster.local", "ns", "sa")})
		if err != nil {
			t.Fatal(err)
		}
		keyPEM, err := pki.EncodeKeyPEM(key)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Publish(&secretmanager.Secret{Name: secretmanager.WorkloadCertName, CertChain: pki.EncodeCertificates(chain[:1]), PrivateKey: keyPEM}); err != nil {
			t.Fatal(err)
		}
		c, err := get()
		if err != nil {
			t.Fatal(err)
		}
		if !c.Leaf.Equal(chain[0]) {
			t.Fatalf("certificate %d: not the published one", i)
		}
		if again, err := get(); err != nil || again != c {
			t.Fatalf("certificate %d: parsed again (%v)", i, err)
		}
	}
}

type tokenFunc func(context.Context) (string, error)

func (f tokenFunc) Token(ctx context.Context) (string, error) { return f(ctx) }

// TestCertWhenNoToken: the control plane is offered the workload certificate
// only when no bearer token can be had.
func TestCertWhenNoToken(t *testing.T) {
	want := &tls.Certificate{Certificate: [][]byte{{1}}}
	cert := func() (*tls.Certificate, error) { return want, nil }
	withToken := certWhenNoToken(tokenFunc(func(context.Context) (string, error) { return "jwt", nil }), cert)
	if c, err := withToken(); c != nil || !errors.Is(err, errTokenSent) {
		t.Fatalf("with a token: %v, %v; want no certificate", c, err)
	}
	noToken := certWhenNoToken(tokenFunc(func(context.Context) (string, error) { return "", credfetcher.ErrNoToken }), cert)
	if c, err := noToken(); c != want || err != nil {
		t.Fatalf("without a token: %v, %v; want the workload certificate", c, err)
	}
	if c, err := certWhenNoToken(nil, cert)(); c != want || err != nil {
		t.Fatalf("no token source: %v, %v; want the workload certificate", c, err)
	}
}

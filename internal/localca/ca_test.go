package localca_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

var id = pki.SPIFFEIdentity("cluster.local", "shop", "web")

func newKey(t *testing.T) any {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	return k.Public()
}

func TestNewDefaults(t *testing.T) {
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r := ca.Root()
	if !r.IsCA || r.Subject.CommonName != "meshagent local CA" || r.CheckSignatureFrom(r) != nil {
		t.Errorf("root: CA=%v CN=%q", r.IsCA, r.Subject.CommonName)
	}
	if life := r.NotAfter.Sub(r.NotBefore); life < 9*365*24*time.Hour {
		t.Errorf("root lifetime %s", life)
	}
	roots, err := pki.ParseCertificates(ca.RootPEM())
	if err != nil || len(roots) != 1 || !roots[0].Equal(r) {
		t.Errorf("RootPEM: %v", err)
	}
	chain, err := ca.Issue(localca.Leaf{PublicKey: newKey(t), Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 || !chain[1].Equal(r) {
		t.Fatalf("chain without intermediate has %d certs", len(chain))
	}
	if life := chain[0].NotAfter.Sub(chain[0].NotBefore); life != 24*time.Hour+time.Minute {
		t.Errorf("default leaf lifetime %s", life)
	}
}

func TestIssueWithIntermediate(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	ca, err := localca.New(localca.Config{Name: "test CA", KeyType: pki.ECP384, Intermediate: true, Lifetime: 48 * time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	pub := newKey(t)
	chain, err := ca.Issue(localca.Leaf{PublicKey: pub, Identity: id, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 3 || !chain[1].IsCA || !chain[2].Equal(ca.Root()) || chain[1].Subject.CommonName != "test CA intermediate" {
		t.Fatalf("chain %d", len(chain))
	}
	leaf := chain[0]
	if !leaf.NotAfter.Equal(now.Add(time.Hour)) || !leaf.NotBefore.Equal(now.Add(-time.Minute)) {
		t.Errorf("validity %s - %s", leaf.NotBefore, leaf.NotAfter)
	}
	if err := pki.VerifyIssued(chain, pub, id, ca.Pool(), now); err != nil {
		t.Errorf("issued chain does not verify: %v", err)
	}
	if leaf.IsCA || leaf.KeyUsage&x509.KeyUsageCertSign != 0 {
		t.Error("leaf can sign certificates")
	}

	nb := now.Add(time.Hour)
	chain, err = ca.Issue(localca.Leaf{PublicKey: pub, Identity: pki.Identity{DNSName: "web.shop.svc"}, DNSNames: []string{"extra"}, IPs: []net.IP{net.IPv6loopback}, NotBefore: nb, NotAfter: nb.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	leaf = chain[0]
	if len(leaf.DNSNames) != 2 || leaf.DNSNames[0] != "web.shop.svc" || len(leaf.IPAddresses) != 1 || len(leaf.URIs) != 0 {
		t.Errorf("SANs %v %v %v", leaf.DNSNames, leaf.IPAddresses, leaf.URIs)
	}
	if !leaf.NotBefore.Equal(nb) || !leaf.NotAfter.Equal(nb.Add(time.Minute)) {
		t.Errorf("explicit validity %s - %s", leaf.NotBefore, leaf.NotAfter)
	}
	if _, err := ca.Issue(localca.Leaf{PublicKey: pub, Identity: pki.Identity{SPIFFEID: "%zz"}}); err == nil {
		t.Error("bad SPIFFE ID accepted")
	}
	if _, err := ca.Issue(localca.Leaf{PublicKey: "not a key", Identity: id}); err == nil {
		t.Error("bad public key accepted")
	}
}

func TestSignCSRUsesTheCallersIdentity(t *testing.T) {
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, pki.SPIFFEIdentity("cluster.local", "other", "admin"))
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.SignCSR(csr, id, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.VerifyIssued(chain, key.Public(), id, ca.Pool(), time.Now()); err != nil {
		t.Errorf("signed chain: %v", err)
	}
	if life := chain[0].NotAfter.Sub(chain[0].NotBefore); life != 11*time.Minute {
		t.Errorf("lifetime %s", life)
	}
	if _, err := ca.SignCSR([]byte("garbage"), id, time.Minute); err == nil {
		t.Error("garbage CSR signed")
	}
}

// TestServerTLS runs a real TLS handshake on loopback against a serving
// certificate from the CA.
func TestServerTLS(t *testing.T) {
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServerTLS([]string{"istiod.istio-system.svc"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.Certificate) != 2 || cert.Leaf == nil {
		t.Fatalf("tls.Certificate has %d certs (want leaf + intermediate, no root)", len(cert.Certificate))
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_, _ = io.WriteString(c, "hi")
			c.Close()
		}
	}()
	defer wg.Wait()
	defer ln.Close()

	dial := func(name string, pool *x509.CertPool) error {
		d := tls.Dialer{Config: &tls.Config{ServerName: name, RootCAs: pool, MinVersion: tls.VersionTLS12}}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = io.ReadAll(c)
		return err
	}
	if err := dial("istiod.istio-system.svc", ca.Pool()); err != nil {
		t.Errorf("handshake by DNS name: %v", err)
	}
	if err := dial("127.0.0.1", ca.Pool()); err != nil {
		t.Errorf("handshake by IP: %v", err)
	}
	if err := dial("other.svc", ca.Pool()); err == nil {
		t.Error("handshake with a wrong server name succeeded")
	}
	other, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dial("istiod.istio-system.svc", other.Pool()); err == nil {
		t.Error("handshake against a foreign root succeeded")
	}
}

func TestConcurrentIssue(t *testing.T) {
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	pub := newKey(t)
	var wg sync.WaitGroup
	serials := make(chan string, 32)
	for range 32 {
		wg.Go(func() {
			chain, err := ca.Issue(localca.Leaf{PublicKey: pub, Identity: id})
			if err != nil {
				t.Error(err)
				return
			}
			serials <- chain[0].SerialNumber.String()
		})
	}
	wg.Wait()
	close(serials)
	seen := map[string]bool{}
	for s := range serials {
		if seen[s] {
			t.Errorf("serial %s issued twice", s)
		}
		seen[s] = true
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

package pki_test

import (
	"crypto"
	"crypto/x509"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

var testID = pki.SPIFFEIdentity("cluster.local", "shop", "web")

func newKey(t testing.TB) crypto.Signer {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newCA(t testing.TB, now time.Time) *localca.CA {
	t.Helper()
	ca, err := localca.New(localca.Config{Intermediate: true, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t testing.TB, ca *localca.CA, l localca.Leaf) []*x509.Certificate {
	t.Helper()
	chain, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	return chain
}

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

var loopbackIP = net.IPv4(127, 0, 0, 1)

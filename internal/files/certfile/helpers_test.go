package certfile

import (
	"crypto"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testID = pki.SPIFFEIdentity("cluster.local", "ns", "sa")

func newCA(t testing.TB) *localca.CA {
	t.Helper()
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// issued is a chain and key in the PEM forms a file holds.
type issued struct {
	chain            []*x509.Certificate
	key              crypto.Signer
	chainPEM, keyPEM []byte
}

func issue(t testing.TB, ca *localca.CA, l localca.Leaf) issued {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	l.PublicKey = key.Public()
	if l.Identity.IsZero() {
		l.Identity = testID
	}
	chain, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	// The CA's chain ends with the root; a workload chain file does not.
	chain = chain[:len(chain)-1]
	return issued{chain: chain, key: key, chainPEM: pki.EncodeCertificates(chain), keyPEM: keyPEM}
}

func writeFile(t testing.TB, p string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// replace writes data to p atomically.
func replace(t testing.TB, p string, data []byte) {
	t.Helper()
	tmp := p + ".tmp"
	writeFile(t, tmp, data)
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}

func waitChanged(t *testing.T, ch <-chan struct{}, within time.Duration) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(within):
		t.Fatalf("no new value within %s", within)
	}
}

// expectRejected waits until count goes above before (the reload after a
// bad change has happened and was refused), then checks that no new value
// was published.
func expectRejected(t *testing.T, count func() float64, before float64, changed <-chan struct{}) {
	t.Helper()
	testwait.For(t, "a rejected load", func() bool { return count() > before })
	select {
	case <-changed:
		t.Fatal("a new value was published")
	default:
	}
}

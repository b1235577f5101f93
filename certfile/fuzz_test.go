package certfile

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/localca"
	"github.com/meshagent/meshagent/pki"
)

func pairSeeds(f *testing.F) {
	ca := newCA(f)
	a := issue(f, ca, localca.Leaf{TTL: time.Hour})
	b := issue(f, ca, localca.Leaf{TTL: time.Hour})
	f.Add(a.chainPEM, a.keyPEM)
	f.Add(a.chainPEM, b.keyPEM)
	f.Add(a.chainPEM[:len(a.chainPEM)/2], a.keyPEM)
	f.Add(a.chainPEM, a.keyPEM[:len(a.keyPEM)-20])
	f.Add(append(bytes.Clone(a.chainPEM), a.keyPEM...), a.keyPEM)
	f.Add(a.keyPEM, a.chainPEM)
	f.Add([]byte{}, []byte{})
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), []byte("-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"))
}

// Whatever the files hold, loading returns a matching, unexpired pair or an
// error; it never panics. A loaded pair's normalised form loads again to the
// same pair.
func FuzzLoadPair(f *testing.F) {
	pairSeeds(f)
	now := time.Now()
	f.Fuzz(func(t *testing.T, chain, key []byte) {
		dir := t.TempDir()
		cert, keyPath := filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem")
		writeFile(t, cert, chain)
		writeFile(t, keyPath, key)
		p, err := LoadPair(cert, keyPath, now)
		if err != nil {
			if Reason(err) == "" {
				t.Fatal("error without a reason")
			}
			return
		}
		if !pki.PublicKeysEqual(p.Key.Public(), p.Leaf().PublicKey) {
			t.Fatal("mismatched pair loaded")
		}
		if !now.Before(p.Leaf().NotAfter) {
			t.Fatal("expired pair loaded")
		}
		again, err := ParsePair(p.ChainPEM, p.KeyPEM, now)
		if err != nil || !again.Equal(p) {
			t.Fatalf("normalised pair does not load again: %v", err)
		}
	})
}

func FuzzLoadBundle(f *testing.F) {
	a, b := newCA(f), newCA(f)
	both := append(a.RootPEM(), b.RootPEM()...)
	f.Add(both)
	f.Add(both[:len(both)-30])
	f.Add(a.RootPEM())
	f.Add([]byte("# comment\n" + string(a.RootPEM()) + "trailing"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "root-cert.pem")
		writeFile(t, p, data)
		strict, err := LoadBundle(p)
		if err == nil {
			if len(strict.Certs) == 0 {
				t.Fatal("empty bundle loaded")
			}
			again, err := ParseBundle(strict.PEM)
			if err != nil || !again.Equal(strict) {
				t.Fatalf("normalised bundle does not parse again: %v", err)
			}
		}
		lenient, lerr := LoadSystemBundle(p)
		if lerr == nil && len(lenient.Certs) == 0 {
			t.Fatal("empty system bundle loaded")
		}
		// Whatever the strict loader accepts, the lenient one accepts too.
		if err == nil && (lerr != nil || !lenient.Equal(strict)) {
			t.Fatalf("strict and lenient loaders disagree: %v", lerr)
		}
	})
}

package certfile

import (
	"bytes"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

// The fuzz targets drive the parsers behind LoadPair, LoadBundle and
// LoadSystemBundle with arbitrary file contents; the loaders add only the
// file reads (tested in pair_test.go and system_test.go), and keeping the
// disk out of the loop lets the fuzzer run thousands of times faster.

// Whatever the files hold, a pair is a matching, unexpired chain and key or
// an error with a reason, never a panic; a loaded pair's normalised form
// parses again to the same pair.
func FuzzParsePair(f *testing.F) {
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
	now := time.Now()
	f.Fuzz(func(t *testing.T, chain, key []byte) {
		p, err := ParsePair(chain, key, now)
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
			t.Fatalf("normalised pair does not parse again: %v", err)
		}
	})
}

// Root bundles: the strict parser (user files) and the lenient one (system
// bundles) never panic, never return an empty bundle, and agree whenever
// the strict one accepts.
func FuzzParseBundle(f *testing.F) {
	a, b := newCA(f), newCA(f)
	both := append(a.RootPEM(), b.RootPEM()...)
	f.Add(both)
	f.Add(both[:len(both)-30])
	f.Add(a.RootPEM())
	f.Add([]byte("# comment\n" + string(a.RootPEM()) + "trailing"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		strict, err := pki.ParseBundle(data)
		if err == nil {
			if len(strict.Certs()) == 0 {
				t.Fatal("empty bundle loaded")
			}
			again, err := pki.ParseBundle(strict.PEM())
			if err != nil || !again.Equal(strict) {
				t.Fatalf("normalised bundle does not parse again: %v", err)
			}
		}
		lenient, lerr := parseLenient(data)
		if lerr == nil && len(lenient.Certs()) == 0 {
			t.Fatal("empty system bundle loaded")
		}
		if err == nil && (lerr != nil || !lenient.Equal(strict)) {
			t.Fatalf("strict and lenient parsers disagree: %v", lerr)
		}
	})
}

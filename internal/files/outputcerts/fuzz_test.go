package outputcerts

import (
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

// Whatever the output directory holds after a crash or a user's edit, what
// Load does with the two files' contents (certfile.ParsePair, then check)
// yields a valid pair for the identity or an error, never a panic. The file
// reads themselves are covered by load_test.go; keeping the disk out of the
// loop lets the fuzzer run fast.
func FuzzLoad(f *testing.F) {
	ca := newCA(f)
	a := issue(f, ca, localca.Leaf{TTL: time.Hour})
	b := issue(f, ca, localca.Leaf{TTL: time.Hour})
	other := issue(f, ca, localca.Leaf{Identity: pki.SPIFFEIdentity("cluster.local", "vm", "other"), TTL: time.Hour})
	f.Add(a.chainPEM, a.keyPEM)
	f.Add(a.chainPEM, b.keyPEM)
	f.Add(other.chainPEM, other.keyPEM)
	f.Add(a.chainPEM[:300], a.keyPEM)
	f.Add(a.chainPEM, a.keyPEM[:50])
	f.Add([]byte{}, []byte{})
	now := time.Now()
	f.Fuzz(func(t *testing.T, chain, key []byte) {
		p, err := certfile.ParsePair(chain, key, now)
		if err != nil {
			return
		}
		if err := check(p, testID, now); err != nil {
			return
		}
		if !pki.PublicKeysEqual(p.Key.Public(), p.Leaf().PublicKey) {
			t.Fatal("mismatched pair accepted")
		}
		if id, err := pki.IdentityOf(p.Leaf()); err != nil || id != testID {
			t.Fatalf("pair for %v accepted", id)
		}
		if now.Before(p.Leaf().NotBefore) || !now.Before(p.Leaf().NotAfter) {
			t.Fatal("pair not valid now accepted")
		}
	})
}

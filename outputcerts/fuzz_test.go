package outputcerts

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/localca"
	"github.com/meshagent/meshagent/pki"
)

// Whatever the output directory holds after a crash or a user's edit, Load
// returns a valid pair for the identity or an error, never a panic.
func FuzzLoad(f *testing.F) {
	ca := newCA(f)
	a := issue(f, ca, localca.Leaf{TTL: time.Hour})
	b := issue(f, ca, localca.Leaf{TTL: time.Hour})
	f.Add(a.chainPEM, a.keyPEM)
	f.Add(a.chainPEM, b.keyPEM)
	f.Add(a.chainPEM[:300], a.keyPEM)
	f.Add(a.chainPEM, a.keyPEM[:50])
	f.Add([]byte{}, []byte{})
	loadPause = 0
	now := time.Now()
	f.Fuzz(func(t *testing.T, chain, key []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, CertChainFile), chain, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, KeyFile), key, 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := Load(dir, testID, now)
		if err != nil {
			return
		}
		if !pki.PublicKeysEqual(p.Key.Public(), p.Leaf().PublicKey) {
			t.Fatal("mismatched pair loaded")
		}
		if id, err := pki.IdentityOf(p.Leaf()); err != nil || id != testID {
			t.Fatalf("pair for %v loaded", id)
		}
	})
}

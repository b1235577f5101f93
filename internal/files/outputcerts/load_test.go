package outputcerts

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

func TestLoad(t *testing.T) {
	ca := newCA(t)
	now := time.Now()
	good := issue(t, ca, localca.Leaf{TTL: time.Hour})
	expired := issue(t, ca, localca.Leaf{NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour)})
	future := issue(t, ca, localca.Leaf{NotBefore: now.Add(time.Hour), NotAfter: now.Add(2 * time.Hour)})
	otherID := issue(t, ca, localca.Leaf{Identity: pki.SPIFFEIdentity("cluster.local", "vm", "other"), TTL: time.Hour})
	other := issue(t, ca, localca.Leaf{TTL: time.Hour})

	tests := []struct {
		name    string
		files   *Files // nil: empty directory
		wantErr error
	}{
		{name: "good", files: &Files{CertChain: good.chainPEM, Key: good.keyPEM}},
		{name: "missing", wantErr: fs.ErrNotExist},
		{name: "expired", files: &Files{CertChain: expired.chainPEM, Key: expired.keyPEM}, wantErr: pki.ErrNotValidNow},
		{name: "not yet valid", files: &Files{CertChain: future.chainPEM, Key: future.keyPEM}, wantErr: pki.ErrNotValidNow},
		{name: "other identity", files: &Files{CertChain: otherID.chainPEM, Key: otherID.keyPEM}, wantErr: pki.ErrIdentityMismatch},
		{name: "mismatched key", files: &Files{CertChain: good.chainPEM, Key: other.keyPEM}, wantErr: pki.ErrKeyMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.files != nil {
				// Written directly: the writer refuses a mismatched pair.
				if err := os.WriteFile(filepath.Join(dir, files.CertChainFile), tt.files.CertChain, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, files.KeyFile), tt.files.Key, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			p, err := Load(dir, testID, now)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !p.Leaf().Equal(good.chain[0]) || !pki.PublicKeysEqual(p.Key.Public(), good.key.Public()) {
				t.Fatal("loaded the wrong pair")
			}
		})
	}
}

// The round trip a restarted agent makes: what the writer wrote, Load
// returns, and it verifies against the roots written with it.
func TestWriteThenLoad(t *testing.T) {
	ca := newCA(t)
	a := issue(t, ca, localca.Leaf{TTL: time.Hour})
	dir := t.TempDir()
	if _, err := newWriter(t, Config{Dir: dir}).Write(a.files(ca)); err != nil {
		t.Fatal(err)
	}
	p, err := Load(dir, testID, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rootPEM, err := os.ReadFile(filepath.Join(dir, files.RootCertFile))
	if err != nil {
		t.Fatal(err)
	}
	roots, err := pki.ParseCertificates(rootPEM)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.VerifyIssued(p.Chain, a.key.Public(), testID, pki.CertPool(roots), time.Now()); err != nil {
		t.Fatal(err)
	}
}

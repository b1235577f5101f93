package test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/heavy"
	"github.com/meshagent/meshagent/test/kubeenv"
)

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// helperFiles is what spiffe-helper wrote, once it is a consistent set: a
// leaf with the workload's SPIFFE ID, the key that matches it, and a bundle.
type helperFiles struct {
	leaf   *x509.Certificate
	bundle []*x509.Certificate
}

func readHelperFiles(dir string) (*helperFiles, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, "svid.pem"))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "svid_key.pem"))
	if err != nil {
		return nil, err
	}
	bundlePEM, err := os.ReadFile(filepath.Join(dir, "svid_bundle.pem"))
	if err != nil {
		return nil, err
	}
	chain, err := pki.ParseCertificates(certPEM)
	if err != nil {
		return nil, fmt.Errorf("svid.pem: %w", err)
	}
	if b, _ := pem.Decode(keyPEM); b == nil || b.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("svid_key.pem is not a PKCS#8 PEM key")
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("svid_key.pem: %w", err)
	}
	if !pki.PublicKeysEqual(key.Public(), chain[0].PublicKey) {
		return nil, fmt.Errorf("svid_key.pem does not match svid.pem (files being replaced)")
	}
	bundle, err := pki.ParseCertificates(bundlePEM)
	if err != nil {
		return nil, fmt.Errorf("svid_bundle.pem: %w", err)
	}
	return &helperFiles{leaf: chain[0], bundle: bundle}, nil
}

// spiffe-helper v0.11.0, pointed at the agent binary's socket, writes the
// SVID, its key and the bundle, and writes them again on every rotation.
func TestSpiffeHelperWritesAndRewritesFiles(t *testing.T) {
	heavy.Skip(t, "runs spiffe-helper and the built agent")
	helper, err := kubeenv.ToolPath("spiffe-helper")
	if err != nil {
		t.Fatal(err)
	}
	p, ca := wlAgent(t, "4s")
	certs := filepath.Join(t.TempDir(), "certs")
	if err := os.Mkdir(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "helper.conf")
	flWrite(t, conf, fmt.Appendf(nil, `agent_address = %q
cert_dir = %q
daemon_mode = true
svid_file_name = "svid.pem"
svid_key_file_name = "svid_key.pem"
svid_bundle_file_name = "svid_bundle.pem"
`, p.Socket(), certs))

	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, helper, "-config", conf)
	var logs lockedBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("spiffe-helper output:\n%s", logs.String())
		}
	})

	root, err := pki.ParseCertificates(ca.RootPEM())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	testwait.Within(t, 30*time.Second, "spiffe-helper to write 3 certificates (the first and two rotations)", func() bool {
		f, err := readHelperFiles(certs)
		if err != nil {
			return false
		}
		if serial := f.leaf.SerialNumber.String(); !seen[serial] {
			seen[serial] = true
			if len(f.leaf.URIs) != 1 || f.leaf.URIs[0].String() != wlSVID.String() {
				t.Fatalf("svid.pem holds %v, want %s", f.leaf.URIs, wlSVID)
			}
			if len(f.bundle) != 1 || !f.bundle[0].Equal(root[0]) {
				t.Fatalf("svid_bundle.pem holds %d certificates, want the CA root", len(f.bundle))
			}
		}
		return len(seen) >= 3
	})
	info, err := os.Stat(filepath.Join(certs, "svid_key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("svid_key.pem mode %v, want 0600", info.Mode().Perm())
	}
}

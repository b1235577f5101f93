package test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/sdsclient"
)

const flDebounce = 100 * time.Millisecond

// flEnv is the environment every file-mode agent gets.
func flEnv(extra ...string) []string {
	return append([]string{
		"STATUS_PORT=0",
		"MESHAGENT_STATUS_HOST=127.0.0.1",
		"MESHAGENT_XDS_PROXY=false",
		"FILE_DEBOUNCE_DURATION=" + flDebounce.String(),
		"MESHAGENT_LOG_LEVEL=debug",
		// These tests name files anywhere in their directories; what the
		// default directories allow is TestFileResourcesOnlyUnderAllowedDirs'.
		"MESHAGENT_FILE_RESOURCE_DIRS=/",
	}, extra...)
}

func flCA(t *testing.T) *localca.CA {
	t.Helper()
	ca, err := localca.New(localca.Config{Name: "files test CA", Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// flIssue returns a new chain (leaf and intermediates) and key for id.
func flIssue(t *testing.T, ca *localca.CA, id pki.Identity, ttl time.Duration) (chain, key []byte) {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	// NotBefore close to now, so renewal at a share of the lifetime falls
	// where ttl suggests (the CA's default backdates by a minute).
	certs, err := ca.Issue(localca.Leaf{PublicKey: k.Public(), Identity: id, NotBefore: time.Now().Add(-time.Second), TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	key, err = pki.EncodeKeyPEM(k)
	if err != nil {
		t.Fatal(err)
	}
	return pki.EncodeCertificates(certs[:len(certs)-1]), key
}

func flWrite(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// flRename replaces path through a rename of a file written beside it.
func flRename(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	flWrite(t, tmp, data)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func flSymlinkSwap(t *testing.T, target, link string) {
	t.Helper()
	tmp := link + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

func flStream(t *testing.T, socket string, names ...string) *sdsclient.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, err := c.Stream(context.Background(), sdsclient.StreamConfig{Names: names})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// flWaitCert waits up to within for a response whose every name in names
// carries chain.
func flWaitCert(t *testing.T, s *sdsclient.Stream, within time.Duration, chain []byte, names ...string) *sdsclient.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		r, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("no response with the expected certificate on %v within %v: %v", names, within, err)
		}
		all := true
		for _, n := range names {
			got, _, ok := r.Cert(n)
			all = all && ok && bytes.Equal(got, chain)
		}
		if all {
			return r
		}
	}
}

// flNoCertChange asserts that no response changes name away from chain
// during d.
func flNoCertChange(t *testing.T, s *sdsclient.Stream, d time.Duration, chain []byte, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		r, err := s.Next(ctx)
		if err != nil {
			return
		}
		if got, _, ok := r.Cert(name); ok && !bytes.Equal(got, chain) {
			t.Fatalf("%s changed to another certificate", name)
		}
	}
}

var flID = pki.SPIFFEIdentity("cluster.local", "files", "sa")

// Workload credential files: a plain write, an atomic rename and a
// Kubernetes ..data symlink swap each reach an open stream (default and a
// file-cert: resource over the same files) within the debounce plus 1 s; a
// truncated key is never served.
func TestFilesWorkloadCredentialChanges(t *testing.T) {
	ca := flCA(t)
	dir := agentproc.TempDir(t)
	creds := filepath.Join(dir, "var/run/secrets/workload-spiffe-credentials")
	certPath, keyPath, rootPath := filepath.Join(creds, "cert-chain.pem"), filepath.Join(creds, "key.pem"), filepath.Join(creds, "root-cert.pem")
	chain, key := flIssue(t, ca, flID, time.Hour)
	flWrite(t, certPath, chain)
	flWrite(t, keyPath, key)
	flWrite(t, rootPath, ca.RootPEM())

	p := agentproc.Start(t, dir, flEnv()...)
	fileCert := secretmanager.FileCertPrefix + certPath + "~" + keyPath
	fileRoot := secretmanager.FileRootPrefix + rootPath
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName, secretmanager.RootCertName, fileCert, fileRoot)
	r := flWaitCert(t, s, 15*time.Second, chain, secretmanager.WorkloadCertName, fileCert)
	for _, n := range []string{secretmanager.RootCertName, fileRoot} {
		if got, ok := r.TrustedCA(n); !ok || !bytes.Equal(got, ca.RootPEM()) {
			t.Fatalf("%s: trusted CA %q", n, got)
		}
	}
	within := flDebounce + time.Second
	both := []string{secretmanager.WorkloadCertName, fileCert}

	t.Run("plain write", func(t *testing.T) {
		chain, key = flIssue(t, ca, flID, time.Hour)
		flWrite(t, keyPath, key)
		flWrite(t, certPath, chain)
		flWaitCert(t, s, within, chain, both...)
	})
	t.Run("atomic rename", func(t *testing.T) {
		chain, key = flIssue(t, ca, flID, time.Hour)
		flRename(t, keyPath, key)
		flRename(t, certPath, chain)
		flWaitCert(t, s, within, chain, both...)
	})
	t.Run("truncated key", func(t *testing.T) {
		flWrite(t, keyPath, key[:len(key)/2])
		flNoCertChange(t, s, 5*flDebounce+500*time.Millisecond, chain, secretmanager.WorkloadCertName)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := sdsclient.Dial(ctx, p.Socket())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		r, err := c.Fetch(ctx, secretmanager.WorkloadCertName, fileCert)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range both {
			got, gotKey, ok := r.Cert(n)
			if !ok || !bytes.Equal(got, chain) || !bytes.Equal(gotKey, key) {
				t.Fatalf("%s: the last good pair was not kept after a truncated key", n)
			}
		}
	})
	t.Run("..data symlink swap", func(t *testing.T) {
		// Move to the layout a Kubernetes volume uses: files are symlinks
		// through ..data to a timestamped directory.
		ts1 := filepath.Join(creds, "..2026_01")
		chain, key = flIssue(t, ca, flID, time.Hour)
		flWrite(t, filepath.Join(ts1, "cert-chain.pem"), chain)
		flWrite(t, filepath.Join(ts1, "key.pem"), key)
		flWrite(t, filepath.Join(ts1, "root-cert.pem"), ca.RootPEM())
		flSymlinkSwap(t, "..2026_01", filepath.Join(creds, "..data"))
		for _, f := range []string{"cert-chain.pem", "key.pem", "root-cert.pem"} {
			flSymlinkSwap(t, filepath.Join("..data", f), filepath.Join(creds, f))
		}
		flWaitCert(t, s, within, chain, both...)

		// The swap itself: a new timestamped directory, ..data repointed.
		ts2 := filepath.Join(creds, "..2026_02")
		chain, key = flIssue(t, ca, flID, time.Hour)
		flWrite(t, filepath.Join(ts2, "cert-chain.pem"), chain)
		flWrite(t, filepath.Join(ts2, "key.pem"), key)
		flWrite(t, filepath.Join(ts2, "root-cert.pem"), ca.RootPEM())
		flSymlinkSwap(t, "..2026_02", filepath.Join(creds, "..data"))
		if err := os.RemoveAll(ts1); err != nil {
			t.Fatal(err)
		}
		flWaitCert(t, s, within, chain, both...)
	})
}

// FILE_MOUNTED_CERTS=true serves ./etc/certs and follows changes.
func TestFilesMountedCerts(t *testing.T) {
	ca := flCA(t)
	dir := agentproc.TempDir(t)
	certs := filepath.Join(dir, "etc/certs")
	chain, key := flIssue(t, ca, flID, time.Hour)
	flWrite(t, filepath.Join(certs, "cert-chain.pem"), chain)
	flWrite(t, filepath.Join(certs, "key.pem"), key)
	flWrite(t, filepath.Join(certs, "root-cert.pem"), ca.RootPEM())

	p := agentproc.Start(t, dir, flEnv("FILE_MOUNTED_CERTS=true")...)
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName, secretmanager.RootCertName)
	r := flWaitCert(t, s, 15*time.Second, chain, secretmanager.WorkloadCertName)
	if got, ok := r.TrustedCA(secretmanager.RootCertName); !ok || !bytes.Equal(got, ca.RootPEM()) {
		t.Fatalf("ROOTCA: %q", got)
	}

	chain, key = flIssue(t, ca, flID, time.Hour)
	flRename(t, filepath.Join(certs, "key.pem"), key)
	flRename(t, filepath.Join(certs, "cert-chain.pem"), chain)
	flWaitCert(t, s, flDebounce+time.Second, chain, secretmanager.WorkloadCertName)

	// Names that cannot be served are refused with InvalidArgument.
	fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer fcancel()
	c, err := sdsclient.Dial(fctx, p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, name := range []string{
		secretmanager.FileCertPrefix + filepath.Join(dir, "missing.pem") + "~" + filepath.Join(dir, "missing-key.pem"),
		secretmanager.FileCertPrefix + "no-key-path",
		secretmanager.FileRootPrefix + filepath.Join(dir, "missing-root.pem"),
	} {
		if _, err := c.Fetch(fctx, name); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%q: %v, want InvalidArgument", name, err)
		}
	}

	// A new root bundle (old and new roots) reaches ROOTCA.
	ca2 := flCA(t)
	bundle := append(append([]byte{}, ca.RootPEM()...), ca2.RootPEM()...)
	flRename(t, filepath.Join(certs, "root-cert.pem"), bundle)
	ctx, cancel := context.WithTimeout(context.Background(), flDebounce+time.Second)
	defer cancel()
	for {
		r, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("ROOTCA did not change to the two-root bundle: %v", err)
		}
		if got, ok := r.TrustedCA(secretmanager.RootCertName); ok && bytes.Equal(got, bundle) {
			break
		}
	}
}

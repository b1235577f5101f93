package fileprovider

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/certfile"
	"github.com/meshagent/meshagent/localca"
	"github.com/meshagent/meshagent/pki"
	"github.com/meshagent/meshagent/secretmanager"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const debounce = 20 * time.Millisecond

func newCA(t *testing.T) *localca.CA {
	t.Helper()
	ca, err := localca.New(localca.Config{Name: "fileprovider test"})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// issue returns a chain and key PEM for a fresh key.
func issue(t *testing.T, ca *localca.CA) (chain, key []byte) {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := ca.Issue(localca.Leaf{PublicKey: k.Public(), Identity: pki.SPIFFEIdentity("cluster.local", "ns", "sa"), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	key, err = pki.EncodeKeyPEM(k)
	if err != nil {
		t.Fatal(err)
	}
	return pki.EncodeCertificates(certs[:len(certs)-1]), key
}

// writeAtomic writes data through a rename, as most tools do.
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func start(t *testing.T) *Provider {
	t.Helper()
	p := New(Config{Files: certfile.SourceConfig{Debounce: debounce}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return p
}

func waitSignal(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no change signalled within 5 s")
	}
}

func secret(t *testing.T, p *Provider, name string) *secretmanager.Secret {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := p.Secret(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestFileCertFollowsChangesAndKeepsLastGood(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	chain1, key1 := issue(t, ca)
	writeAtomic(t, certPath, chain1)
	writeAtomic(t, keyPath, key1)

	p := start(t)
	name := secretmanager.FileCertPrefix + certPath + "~" + keyPath
	ch, stop := p.Watch(name)
	defer stop()
	if ch == nil {
		t.Fatal("Watch returned a nil channel for a loadable name")
	}
	s1 := secret(t, p, name)
	if s1.Name != name || !bytes.Equal(s1.CertChain, chain1) || !bytes.Equal(s1.PrivateKey, key1) || s1.IsRoot() {
		t.Fatalf("first secret: name %q, chain equal %v, key equal %v", s1.Name, bytes.Equal(s1.CertChain, chain1), bytes.Equal(s1.PrivateKey, key1))
	}
	if s1.Identity.String() != "spiffe://cluster.local/ns/ns/sa/sa" {
		t.Errorf("identity %v", s1.Identity)
	}
	if again := secret(t, p, name); again.Version != s1.Version {
		t.Errorf("unchanged files gave a new version %d, was %d", again.Version, s1.Version)
	}

	// A truncated key is rejected; the first pair stays.
	if err := os.WriteFile(keyPath, key1[:len(key1)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * debounce) // long enough for the debounced reload to have happened
	if s := secret(t, p, name); s.Version != s1.Version || !bytes.Equal(s.PrivateKey, key1) {
		t.Fatal("a truncated key replaced the last good pair")
	}

	// A new good pair is signalled and served.
	chain2, key2 := issue(t, ca)
	writeAtomic(t, keyPath, key2)
	writeAtomic(t, certPath, chain2)
	deadline := time.Now().Add(5 * time.Second)
	for {
		waitSignal(t, ch)
		s := secret(t, p, name)
		if bytes.Equal(s.CertChain, chain2) && bytes.Equal(s.PrivateKey, key2) {
			if s.Version <= s1.Version {
				t.Errorf("version %d not above %d", s.Version, s1.Version)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new pair was not served")
		}
	}
}

func TestFileRootBundleWithSeveralRoots(t *testing.T) {
	ca1, ca2 := newCA(t), newCA(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "roots.pem")
	writeAtomic(t, path, ca1.RootPEM())
	p := start(t)
	name := secretmanager.FileRootPrefix + path
	ch, stop := p.Watch(name)
	defer stop()
	s := secret(t, p, name)
	if !s.IsRoot() || !bytes.Equal(s.Roots, ca1.RootPEM()) || s.Name != name {
		t.Fatalf("first bundle wrong: %q", s.Roots)
	}
	both := append(append([]byte{}, ca1.RootPEM()...), ca2.RootPEM()...)
	writeAtomic(t, path, both)
	waitSignal(t, ch)
	s = secret(t, p, name)
	b, err := certfile.ParseBundle(s.Roots)
	if err != nil || len(b.Certs) != 2 {
		t.Fatalf("bundle after change: %d roots, %v", len(b.Certs), err)
	}
}

func TestUnservableNames(t *testing.T) {
	dir := t.TempDir()
	p := start(t)
	for _, name := range []string{
		"file-cert:",
		"file-cert:" + filepath.Join(dir, "a"),
		"file-cert:" + filepath.Join(dir, "a") + "~",
		"file-cert:a~b~c",
		"file-cert:" + filepath.Join(dir, "missing") + "~" + filepath.Join(dir, "missing-key"),
		"file-root:",
		"file-root:" + filepath.Join(dir, "missing.pem"),
		"other:x",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := p.Secret(ctx, name)
		cancel()
		if !errors.Is(err, secretmanager.ErrUnknownResource) {
			t.Errorf("%q: error %v, want one wrapping ErrUnknownResource", name, err)
		}
		if ch, stop := p.Watch(name); ch != nil {
			stop()
			t.Errorf("%q: Watch returned a channel", name)
		}
	}
}

func TestNamesAfterStopAreRefused(t *testing.T) {
	ca := newCA(t)
	path := filepath.Join(t.TempDir(), "root.pem")
	writeAtomic(t, path, ca.RootPEM())
	p := New(Config{})
	// Requested before Run: served, and watched once Run starts.
	name := secretmanager.FileRootPrefix + path
	if s := secret(t, p, name); s.Name != name {
		t.Fatalf("name %q", s.Name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := p.Secret(context.Background(), secretmanager.FileRootPrefix+path+"x"); !errors.Is(err, ErrStopped) {
		t.Errorf("after Run: %v, want ErrStopped", err)
	}
	if err := p.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run: %v", err)
	}
}

func TestMaxResources(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	p := New(Config{MaxResources: 1})
	for i, n := range []string{"a.pem", "b.pem"} {
		path := filepath.Join(dir, n)
		writeAtomic(t, path, ca.RootPEM())
		_, err := p.Secret(context.Background(), secretmanager.FileRootPrefix+path)
		if (err != nil) != (i == 1) {
			t.Errorf("resource %d: %v", i, err)
		}
	}
}

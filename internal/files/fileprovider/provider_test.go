package fileprovider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
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
	return startWith(t, Config{Files: certfile.SourceConfig{Debounce: debounce}})
}

func startWith(t *testing.T, cfg Config) *Provider {
	t.Helper()
	p := New(cfg)
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

func secretOf(t *testing.T, p *Provider, name string) *secretmanager.Secret {
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

	reg := prometheus.NewRegistry()
	p := startWith(t, Config{Files: certfile.SourceConfig{Debounce: debounce, Registerer: reg}})
	name := secretmanager.FileCertPrefix + certPath + "~" + keyPath
	ch, stop := p.Watch(name)
	defer stop()
	if ch == nil {
		t.Fatal("Watch returned a nil channel for a loadable name")
	}
	s1 := secretOf(t, p, name)
	if s1.Name != name || !bytes.Equal(s1.CertChain, chain1) || !bytes.Equal(s1.PrivateKey, key1) || s1.IsRoot() {
		t.Fatalf("first secret: name %q, chain equal %v, key equal %v", s1.Name, bytes.Equal(s1.CertChain, chain1), bytes.Equal(s1.PrivateKey, key1))
	}
	if s1.Identity.String() != "spiffe://cluster.local/ns/ns/sa/sa" {
		t.Errorf("identity %v", s1.Identity)
	}
	if again := secretOf(t, p, name); again.Version != s1.Version {
		t.Errorf("unchanged files gave a new version %d, was %d", again.Version, s1.Version)
	}

	// A truncated key is rejected (the reload happens: its failure is
	// counted); the first pair stays.
	if err := os.WriteFile(keyPath, key1[:len(key1)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	waitRejected(t, reg, 1)
	if s := secretOf(t, p, name); s.Version != s1.Version || !bytes.Equal(s.PrivateKey, key1) {
		t.Fatal("a truncated key replaced the last good pair")
	}

	// A new good pair is signalled and served.
	chain2, key2 := issue(t, ca)
	writeAtomic(t, keyPath, key2)
	writeAtomic(t, certPath, chain2)
	deadline := time.Now().Add(5 * time.Second)
	for {
		waitSignal(t, ch)
		s := secretOf(t, p, name)
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

// waitRejected waits until at least n loads of watched files have been
// rejected: the reload after a bad change has happened.
func waitRejected(t *testing.T, reg *prometheus.Registry, n float64) {
	t.Helper()
	testwait.For(t, fmt.Sprintf("%v rejected loads", n), func() bool { return rejectedLoads(t, reg) >= n })
}

func rejectedLoads(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == "meshagent_certfile_load_failures_total" {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
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
	s := secretOf(t, p, name)
	if !s.IsRoot() || !bytes.Equal(s.Roots, ca1.RootPEM()) || s.Name != name {
		t.Fatalf("first bundle wrong: %q", s.Roots)
	}
	both := append(append([]byte{}, ca1.RootPEM()...), ca2.RootPEM()...)
	writeAtomic(t, path, both)
	waitSignal(t, ch)
	s = secretOf(t, p, name)
	b, err := pki.ParseBundle(s.Roots)
	if err != nil || len(b.Certs()) != 2 || !s.Bundle.Equal(b) {
		t.Fatalf("bundle after change: %d roots, %v, parsed bundle carried: %v", len(b.Certs()), err, s.Bundle.Equal(b))
	}
	if cur, err := p.Current(name); err != nil || cur != s {
		t.Fatalf("Current = %v, %v; want the secret Secret returned", cur, err)
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
		if _, err := p.Current(name); !errors.Is(err, secretmanager.ErrUnknownResource) {
			t.Errorf("%q: Current error %v, want one wrapping ErrUnknownResource", name, err)
		}
		if ch, stop := p.Watch(name); ch != nil {
			stop()
			t.Errorf("%q: Watch returned a channel", name)
		}
	}
}

// A name held before Run is watched once Run starts; after Run has
// returned, new names are refused.
func TestNamesAfterStopAreRefused(t *testing.T) {
	ca := newCA(t)
	path := filepath.Join(t.TempDir(), "root.pem")
	writeAtomic(t, path, ca.RootPEM())
	p := New(Config{Files: certfile.SourceConfig{Debounce: debounce}})
	name := secretmanager.FileRootPrefix + path
	ch, stop := p.Watch(name)
	defer stop()
	if s := secretOf(t, p, name); s.Name != name {
		t.Fatalf("name %q", s.Name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	ca2 := newCA(t)
	writeAtomic(t, path, ca2.RootPEM())
	waitSignal(t, ch)
	if s := secretOf(t, p, name); !bytes.Equal(s.Roots, ca2.RootPEM()) {
		t.Error("the change was signalled but not served")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := p.hold(name + "x"); !errors.Is(err, ErrStopped) {
		t.Errorf("after Run: %v, want ErrStopped", err)
	}
	if err := p.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run: %v", err)
	}
}

// MaxResources bounds the names held at once: a third name is refused
// while two are held, and served once one of them is released.
func TestMaxResourcesHeldAtOnce(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	p := startWith(t, Config{MaxResources: 2, Files: certfile.SourceConfig{Debounce: debounce}})
	names := make([]string, 3)
	for i := range names {
		path := filepath.Join(dir, fmt.Sprintf("%d.pem", i))
		writeAtomic(t, path, ca.RootPEM())
		names[i] = secretmanager.FileRootPrefix + path
	}
	_, stop0 := p.Watch(names[0])
	ch1, stop1 := p.Watch(names[1])
	defer stop1()
	if ch, stop := p.Watch(names[2]); ch != nil {
		stop()
		t.Fatal("a third name was held while two are")
	}
	if _, err := p.Secret(context.Background(), names[2]); !errors.Is(err, ErrTooMany) {
		t.Errorf("Secret of an unheld name while full: %v, want ErrTooMany", err)
	}
	stop0()
	stop0() // safe twice; releases once
	ch2, stop2 := p.Watch(names[2])
	defer stop2()
	if ch2 == nil {
		t.Fatal("a name was refused after another was released")
	}
	if got := p.Held(); got != 2 {
		t.Errorf("%d names held, want 2", got)
	}
	// The name still held keeps following its file.
	ca2 := newCA(t)
	writeAtomic(t, strings.TrimPrefix(names[1], secretmanager.FileRootPrefix), ca2.RootPEM())
	waitSignal(t, ch1)
	if s := secretOf(t, p, names[1]); !bytes.Equal(s.Roots, ca2.RootPEM()) {
		t.Error("held name did not follow its file")
	}
}

// Names asked for once and released do not count: 200 distinct names, one
// after another, are all served with a limit of 4, and none stays held.
func TestReleasedNamesAreForgotten(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	p := startWith(t, Config{MaxResources: 4, Files: certfile.SourceConfig{Debounce: debounce}})
	for i := range 200 {
		path := filepath.Join(dir, fmt.Sprintf("r%d.pem", i))
		writeAtomic(t, path, ca.RootPEM())
		name := secretmanager.FileRootPrefix + path
		ch, stop := p.Watch(name)
		if ch == nil {
			t.Fatalf("name %d refused", i)
		}
		if s := secretOf(t, p, name); s.Name != name {
			t.Fatalf("name %q", s.Name)
		}
		stop()
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.Held(); got != 0 {
		t.Errorf("%d names held after every watcher released", got)
	}
}

// Two watchers of one name: the first release keeps it (and its signals),
// the second drops it.
func TestNameHeldUntilLastRelease(t *testing.T) {
	ca := newCA(t)
	path := filepath.Join(t.TempDir(), "root.pem")
	writeAtomic(t, path, ca.RootPEM())
	p := start(t)
	name := secretmanager.FileRootPrefix + path
	_, stopA := p.Watch(name)
	chB, stopB := p.Watch(name)
	stopA()
	if got := p.Held(); got != 1 {
		t.Fatalf("%d names held with one watcher left", got)
	}
	writeAtomic(t, path, newCA(t).RootPEM())
	waitSignal(t, chB)
	stopB()
	if got := p.Held(); got != 0 {
		t.Fatalf("%d names held after the last release", got)
	}
}

// With AllowedDirs, a name is served only when its files lie in an allowed
// directory both as named and with links resolved; a relative directory is
// against the working directory.
func TestAllowedDirs(t *testing.T) {
	ca := newCA(t)
	root := t.TempDir()
	allowed, other := filepath.Join(root, "certs"), filepath.Join(root, "secret")
	for _, d := range []string{allowed, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	chain, key := issue(t, ca)
	writeAtomic(t, filepath.Join(allowed, "cert.pem"), chain)
	writeAtomic(t, filepath.Join(allowed, "key.pem"), key)
	writeAtomic(t, filepath.Join(other, "key.pem"), key)
	writeAtomic(t, filepath.Join(other, "root.pem"), ca.RootPEM())
	if err := os.Symlink(filepath.Join(other, "key.pem"), filepath.Join(allowed, "link.pem")); err != nil {
		t.Fatal(err)
	}
	p := startWith(t, Config{Files: certfile.SourceConfig{Debounce: debounce}, AllowedDirs: []string{allowed}})
	good := secretmanager.FileCertPrefix + filepath.Join(allowed, "cert.pem") + "~" + filepath.Join(allowed, "key.pem")
	if s := secretOf(t, p, good); s.IsRoot() {
		t.Fatal("a root for a file-cert:")
	}
	for _, name := range []string{
		secretmanager.FileCertPrefix + filepath.Join(allowed, "cert.pem") + "~" + filepath.Join(other, "key.pem"),
		secretmanager.FileCertPrefix + filepath.Join(allowed, "cert.pem") + "~" + filepath.Join(allowed, "link.pem"),
		secretmanager.FileRootPrefix + filepath.Join(allowed, "..", "secret", "root.pem"),
		secretmanager.FileRootPrefix + allowed + "x/root.pem",
	} {
		_, err := p.Secret(context.Background(), name)
		if !errors.Is(err, ErrOutsideDirs) || !errors.Is(err, secretmanager.ErrUnknownResource) {
			t.Errorf("%s: %v, want ErrOutsideDirs", name, err)
		}
	}
}

// A held name's files are opened beneath their allowed directory at every
// load, not only checked when it was first asked for: a file replaced
// later by a link that leads out of the directory is not read (the load is
// rejected and the last good value stays); a link that stays inside is
// followed.
func TestAllowedDirsHoldAfterALinkIsSwappedIn(t *testing.T) {
	ca, evil := newCA(t), newCA(t)
	root := t.TempDir()
	allowed, other := filepath.Join(root, "certs"), filepath.Join(root, "secret")
	for _, d := range []string{allowed, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(allowed, "root.pem")
	writeAtomic(t, path, ca.RootPEM())
	writeAtomic(t, filepath.Join(other, "root.pem"), evil.RootPEM())
	reg := prometheus.NewRegistry()
	p := startWith(t, Config{Files: certfile.SourceConfig{Debounce: debounce, Registerer: reg}, AllowedDirs: []string{allowed}})
	name := secretmanager.FileRootPrefix + path
	ch, stop := p.Watch(name)
	defer stop()
	if ch == nil {
		t.Fatal("Watch refused an allowed file")
	}
	first := secretOf(t, p, name)

	tmp := filepath.Join(allowed, "swap")
	if err := os.Symlink(filepath.Join(other, "root.pem"), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitRejected(t, reg, 1)
	if s := secretOf(t, p, name); !bytes.Equal(s.Roots, first.Roots) {
		t.Fatal("a link swapped in later led out of the allowed directory: its target was served")
	}

	// A link inside the directory is followed.
	next := newCA(t)
	writeAtomic(t, filepath.Join(allowed, "next.pem"), next.RootPEM())
	if err := os.Symlink("next.pem", tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the new root served", func() bool {
		return !bytes.Equal(secretOf(t, p, name).Roots, first.Roots)
	})
}

package outputcerts

import (
	"bytes"
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/secretmanager"
)

// dirEvents reports every change in dir (the writer renames files into it).
func dirEvents(t *testing.T, dir string) <-chan fsnotify.Event {
	t.Helper()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	if err := w.Add(dir); err != nil {
		t.Fatal(err)
	}
	return w.Events
}

// waitContent waits, event by event, until the file name in dir holds want.
func waitContent(t *testing.T, events <-chan fsnotify.Event, dir, name string, want []byte) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err == nil && bytes.Equal(got, want) {
			return
		}
		select {
		case <-events:
		case <-timeout:
			t.Fatalf("%s never held the expected content", name)
		}
	}
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// Sync writes the roots at once, the certificate once one is held, and after
// every change only the files whose content changed.
func TestSync(t *testing.T) {
	ca1, ca2 := newCA(t), newCA(t)
	roots, err := secret.NewRoots(ca1.RootPEM(), "test")
	if err != nil {
		t.Fatal(err)
	}
	m, err := secretmanager.New(secretmanager.Config{Roots: roots, Source: "file", TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "out")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	events := dirEvents(t, dir)
	s, err := NewSync(SyncConfig{Secrets: m, Writer: newWriter(t, Config{Dir: dir})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- m.Run(ctx) }()
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}()

	waitContent(t, events, dir, files.RootCertFile, ca1.RootPEM())
	if _, err := os.Stat(filepath.Join(dir, files.KeyFile)); !os.IsNotExist(err) {
		t.Fatalf("key written with no certificate held: %v", err)
	}

	publish := func(p issued) {
		t.Helper()
		if err := m.Publish(&secretmanager.Secret{Name: secretmanager.WorkloadCertName, CertChain: p.chainPEM, PrivateKey: p.keyPEM}); err != nil {
			t.Fatal(err)
		}
		waitContent(t, events, dir, files.KeyFile, p.keyPEM)
		waitContent(t, events, dir, files.CertChainFile, p.chainPEM)
	}
	publish(issue(t, ca1, localca.Leaf{}))
	keyIno, chainIno := inode(t, filepath.Join(dir, files.KeyFile)), inode(t, filepath.Join(dir, files.CertChainFile))

	// A root change rewrites the roots only.
	if err := roots.Set(ca2.RootPEM(), "test"); err != nil {
		t.Fatal(err)
	}
	waitContent(t, events, dir, files.RootCertFile, ca2.RootPEM())
	if inode(t, filepath.Join(dir, files.KeyFile)) != keyIno || inode(t, filepath.Join(dir, files.CertChainFile)) != chainIno {
		t.Fatal("a root change rewrote the certificate files")
	}

	// A rotation rewrites the pair.
	publish(issue(t, ca2, localca.Leaf{TTL: 2 * time.Hour}))
	if inode(t, filepath.Join(dir, files.KeyFile)) == keyIno {
		t.Fatal("the rotated key was not replaced")
	}
}

func TestNewSyncErrors(t *testing.T) {
	w := newWriter(t, Config{Dir: t.TempDir()})
	if _, err := NewSync(SyncConfig{Writer: w}); err == nil {
		t.Error("no secret source accepted")
	}
	if _, err := NewSync(SyncConfig{Secrets: &secretmanager.Manager{}}); err == nil {
		t.Error("no writer accepted")
	}
}

// With a trust domain, Sync also writes the roots as a SPIFFE trust bundle
// map, again after every root change.
func TestSyncWritesTheBundleMap(t *testing.T) {
	ca1, ca2 := newCA(t), newCA(t)
	roots, err := secret.NewRoots(ca1.RootPEM(), "test")
	if err != nil {
		t.Fatal(err)
	}
	m, err := secretmanager.New(secretmanager.Config{Roots: roots, Source: "file", TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "out")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	events := dirEvents(t, dir)
	s, err := NewSync(SyncConfig{Secrets: m, Writer: newWriter(t, Config{Dir: dir}), TrustDomain: "example.org"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- m.Run(ctx) }()
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}()
	for _, ca := range []*localca.CA{ca1, ca2} {
		if err := roots.Set(ca.RootPEM(), "test"); err != nil {
			t.Fatal(err)
		}
		want, err := BundleMap("example.org", []*x509.Certificate{ca.Root()})
		if err != nil {
			t.Fatal(err)
		}
		waitContent(t, events, dir, files.BundleMapFile, want)
	}
}

package certfile

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/secretmanager"
)

// A RootFeed holds the file's bundle from the start, and follows every good
// rewrite of the file into its Roots; a bad rewrite changes nothing.
func TestRootFeed(t *testing.T) {
	ca1, ca2, ca3 := newCA(t), newCA(t), newCA(t)
	p := filepath.Join(t.TempDir(), "root-cert.pem")
	writeFile(t, p, ca1.RootPEM())
	f, err := NewRootFeed(RootFeedConfig{Name: "ca_root", Path: p, Source: SourceConfig{Debounce: testDebounce}})
	if err != nil {
		t.Fatal(err)
	}
	roots := f.Roots()
	if b, source := roots.Bundle(); !b.Certs()[0].Equal(ca1.Root()) || source != p {
		t.Fatalf("initial bundle is not the file's (source %q)", source)
	}
	changes, stop := roots.Watch()
	defer stop()
	runUntilEnd(t, f.Run)

	replace(t, p, ca2.RootPEM())
	waitChanged(t, changes, 10*time.Second)
	if !rootsNow(roots).Certs()[0].Equal(ca2.Root()) {
		t.Fatal("the rotated bundle was not applied")
	}

	// A torn write, then a good one: the first change seen is the good one.
	replace(t, p, ca3.RootPEM()[:40])
	replace(t, p, ca3.RootPEM())
	waitChanged(t, changes, 10*time.Second)
	if !rootsNow(roots).Certs()[0].Equal(ca3.Root()) {
		t.Fatal("the repaired bundle was not applied")
	}
}

// NewRootFeed refuses a bundle that cannot be read now, naming the setting.
func TestRootFeedRefusesUnreadable(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	writeFile(t, garbage, []byte("not a certificate"))
	for _, p := range []string{filepath.Join(dir, "missing.pem"), garbage, ""} {
		_, err := NewRootFeed(RootFeedConfig{Name: "xds_root", Path: p})
		if err == nil || !strings.HasPrefix(err.Error(), "xds_root "+p+":") {
			t.Errorf("%q: err = %v", p, err)
		}
	}
}

// A PairFeed publishes the pair once its files appear, and every rotation
// after; the manager serves them as the workload certificate.
func TestPairFeed(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem")
	m, err := secretmanager.New(secretmanager.Config{Roots: mustRoots(t, ca), Source: "file", TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	changes, stop := m.Watch(pki.Identity{}, secretmanager.WorkloadCertName)
	defer stop()
	f, err := NewPairFeed(PairFeedConfig{
		CertPath: certPath, KeyPath: keyPath, Label: "file-mounted", Into: m,
		Source: SourceConfig{Debounce: testDebounce},
	})
	if err != nil {
		t.Fatal(err)
	}
	runUntilEnd(t, f.Run)

	held := func() *secretmanager.Secret {
		t.Helper()
		now, cancel := context.WithCancel(ctx)
		cancel()
		s, err := m.Secret(now, pki.Identity{}, secretmanager.WorkloadCertName)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for i, leaf := range []localca.Leaf{{}, {TTL: 2 * time.Hour}} {
		p := issue(t, ca, leaf)
		// The key first, then the chain: the feed publishes only a matching pair.
		replace(t, keyPath, p.keyPEM)
		replace(t, certPath, p.chainPEM)
		waitChanged(t, changes, 10*time.Second)
		s := held()
		if !s.Leaf.Equal(p.chain[0]) || s.Source != "file-mounted" || s.Identity != testID {
			t.Fatalf("pair %d: served %s from %q for %v", i, s.Leaf.SerialNumber, s.Source, s.Identity)
		}
	}
}

func TestPairFeedConfigErrors(t *testing.T) {
	m, err := secretmanager.New(secretmanager.Config{Roots: mustRoots(t, newCA(t)), TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]PairFeedConfig{
		"no publisher": {CertPath: "c", KeyPath: "k"},
		"no key path":  {CertPath: "c", Into: m},
	} {
		if _, err := NewPairFeed(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func mustRoots(t *testing.T, ca *localca.CA) *secretmanager.Roots {
	t.Helper()
	r, err := secret.NewRoots(ca.RootPEM(), "test")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// rootsNow is the bundle roots hold now.
func rootsNow(roots *secretmanager.Roots) *pki.Bundle {
	b, _ := roots.Bundle()
	return b
}

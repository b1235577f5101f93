package certfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

const testDebounce = 20 * time.Millisecond

func runSource[T Value[T]](t *testing.T, s *Source[T]) {
	t.Helper()
	runUntilEnd(t, s.Run)
}

// runUntilEnd runs run until the test ends and checks it returned nil.
func runUntilEnd(t *testing.T, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func waitFor[T Value[T]](t *testing.T, s *Source[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestPairSource(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem")
	a := issue(t, ca, localca.Leaf{TTL: time.Hour})
	writeFile(t, cert, a.chainPEM)
	writeFile(t, key, a.keyPEM)

	reg := prometheus.NewRegistry()
	s, err := NewPairSource(SourceConfig{Debounce: testDebounce, Registerer: reg}, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	runSource(t, s)
	if got := waitFor(t, s); !got.Leaf().Equal(a.chain[0]) {
		t.Fatal("first value is not the pair on disk")
	}
	failures := func(reason string) float64 {
		return testutil.ToFloat64(s.metrics.failures.WithLabelValues("pair", reason))
	}

	// A new pair written key first, then chain, each atomically.
	b := issue(t, ca, localca.Leaf{TTL: time.Hour})
	_, _, changed := s.Current()
	replace(t, key, b.keyPEM)
	replace(t, cert, b.chainPEM)
	waitChanged(t, changed, testDebounce+time.Second)
	if got, _, _ := s.Current(); !got.Leaf().Equal(b.chain[0]) {
		t.Fatal("new pair not published")
	}

	bad := []struct {
		name   string
		write  func()
		reason string
	}{
		{"truncated key", func() { writeFile(t, key, b.keyPEM[:len(b.keyPEM)/2]) }, "malformed"},
		{"mismatched pair", func() { writeFile(t, key, a.keyPEM) }, "key_mismatch"},
		{"expired pair", func() {
			e := issue(t, ca, localca.Leaf{NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(-time.Minute)})
			writeFile(t, key, e.keyPEM)
			writeFile(t, cert, e.chainPEM)
		}, "not_valid_now"},
		{"deleted key", func() {
			if err := os.Remove(key); err != nil {
				t.Fatal(err)
			}
		}, "missing"},
	}
	for _, tt := range bad {
		before := failures(tt.reason)
		_, _, changed := s.Current()
		tt.write()
		expectRejected(t, func() float64 { return failures(tt.reason) }, before, changed)
		if got, _, _ := s.Current(); !got.Leaf().Equal(b.chain[0]) {
			t.Fatalf("%s: the last good pair was replaced", tt.name)
		}
	}

	c := issue(t, ca, localca.Leaf{TTL: time.Hour})
	_, _, changed = s.Current()
	replace(t, key, c.keyPEM)
	replace(t, cert, c.chainPEM)
	waitChanged(t, changed, testDebounce+time.Second)
	if got, _, _ := s.Current(); !got.Leaf().Equal(c.chain[0]) {
		t.Fatal("good pair after bad ones not published")
	}
	if n := testutil.ToFloat64(s.metrics.updates.WithLabelValues("pair")); n != 3 {
		t.Fatalf("%v updates counted, want 3", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	if !names["meshagent_certfile_load_failures_total"] || !names["meshagent_certfile_updates_total"] {
		t.Fatalf("metrics missing from the registry: %v", names)
	}
}

// Kubernetes secret volume: the files are symlinks through ..data, which is
// swapped atomically to a new timestamped directory.
func TestPairSourceKubernetesSwap(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	swap := func(n int, p issued) {
		ts := fmt.Sprintf("..2026_11_21_10_00_%02d.%d", n, 100+n)
		writeFile(t, filepath.Join(dir, ts, "tls.crt"), p.chainPEM)
		writeFile(t, filepath.Join(dir, ts, "tls.key"), p.keyPEM)
		old, _ := os.Readlink(filepath.Join(dir, "..data"))
		if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if old != "" {
			_ = os.RemoveAll(filepath.Join(dir, old))
		}
	}
	first := issue(t, ca, localca.Leaf{TTL: time.Hour})
	swap(0, first)
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewPairSource(SourceConfig{Debounce: testDebounce}, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	runSource(t, s)
	waitFor(t, s)
	for n := 1; n <= 3; n++ {
		next := issue(t, ca, localca.Leaf{TTL: time.Hour})
		_, _, changed := s.Current()
		start := time.Now()
		swap(n, next)
		waitChanged(t, changed, testDebounce+time.Second)
		if got, _, _ := s.Current(); !got.Leaf().Equal(next.chain[0]) {
			t.Fatalf("swap %d: wrong pair published", n)
		}
		t.Logf("swap %d picked up after %s", n, time.Since(start))
	}
}

// Root rotation: old root, then old and new, then new only.
func TestBundleSourceRotation(t *testing.T) {
	oldCA, newCA2 := newCA(t), newCA(t)
	p := filepath.Join(t.TempDir(), "root-cert.pem")
	writeFile(t, p, oldCA.RootPEM())
	s, err := NewBundleSource(SourceConfig{Debounce: testDebounce}, p)
	if err != nil {
		t.Fatal(err)
	}
	runSource(t, s)
	if b := waitFor(t, s); len(b.Certs()) != 1 {
		t.Fatalf("%d roots", len(b.Certs()))
	}
	steps := []struct {
		data  []byte
		roots int
	}{
		{append(oldCA.RootPEM(), newCA2.RootPEM()...), 2},
		{newCA2.RootPEM(), 1},
	}
	for i, st := range steps {
		_, _, changed := s.Current()
		replace(t, p, st.data)
		waitChanged(t, changed, testDebounce+time.Second)
		if b, _, _ := s.Current(); len(b.Certs()) != st.roots {
			t.Fatalf("step %d: %d roots, want %d", i, len(b.Certs()), st.roots)
		}
	}
	// A half-written bundle is not taken for a smaller one.
	both := append(oldCA.RootPEM(), newCA2.RootPEM()...)
	_, _, changed := s.Current()
	malformed := func() float64 { return testutil.ToFloat64(s.metrics.failures.WithLabelValues("bundle", "malformed")) }
	before := malformed()
	writeFile(t, p, both[:len(oldCA.RootPEM())+100])
	expectRejected(t, malformed, before, changed)
	if b, _, _ := s.Current(); !b.Certs()[0].Equal(newCA2.Root()) {
		t.Fatal("last good bundle replaced")
	}
}

func TestSourceWaitsForFilesThatAppearLater(t *testing.T) {
	ca := newCA(t)
	dir := filepath.Join(t.TempDir(), "not", "yet")
	cert, key := filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem")
	s, err := NewPairSource(SourceConfig{Debounce: testDebounce}, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reload(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Reload before the files exist: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait without files: %v", err)
	}
	runSource(t, s)
	a := issue(t, ca, localca.Leaf{TTL: time.Hour})
	writeFile(t, key, a.keyPEM)
	writeFile(t, cert, a.chainPEM)
	if got := waitFor(t, s); !got.Leaf().Equal(a.chain[0]) {
		t.Fatal("wrong pair")
	}
}

// Expiry is judged by the injected clock.
func TestReloadUsesClock(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	a := issue(t, ca, localca.Leaf{TTL: time.Hour})
	writeFile(t, cert, a.chainPEM)
	writeFile(t, key, a.keyPEM)
	clk := clocktesting.NewFakeClock(time.Now().Add(2 * time.Hour))
	s, err := NewPairSource(SourceConfig{Debounce: 100 * time.Millisecond, Clock: clk}, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reload(); !errors.Is(err, pki.ErrNotValidNow) {
		t.Fatalf("Reload two hours later: %v, want ErrNotValidNow", err)
	}
	clk.SetTime(time.Now())
	if changed, err := s.Reload(); err != nil || !changed {
		t.Fatalf("Reload now: %v, %v", changed, err)
	}
	if changed, err := s.Reload(); err != nil || changed {
		t.Fatalf("Reload of the same files published again: %v, %v", changed, err)
	}
}

func TestSourcesShareRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	var sources []*Source[*pki.Bundle]
	for i := range 2 {
		s, err := NewBundleSource(SourceConfig{Debounce: 100 * time.Millisecond, Registerer: reg}, filepath.Join(dir, fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		sources = append(sources, s)
	}
	for _, s := range sources {
		_, _ = s.Reload()
	}
	if got := testutil.ToFloat64(sources[0].metrics.failures.WithLabelValues("bundle", "missing")); got != 2 {
		t.Fatalf("shared counter = %v, want 2", got)
	}
}

func TestSystemBundleSource(t *testing.T) {
	ca := newCA(t)
	p := filepath.Join(t.TempDir(), "ca-certificates.crt")
	writeFile(t, p, ca.RootPEM())
	t.Setenv("SSL_CERT_FILE", p)
	s, err := NewSystemBundleSource(SourceConfig{Debounce: testDebounce})
	if err != nil {
		t.Fatal(err)
	}
	runSource(t, s)
	waitFor(t, s)
	other := newCA(t)
	_, _, changed := s.Current()
	replace(t, p, append(ca.RootPEM(), other.RootPEM()...))
	waitChanged(t, changed, testDebounce+time.Second)
	if b, _, _ := s.Current(); len(b.Certs()) != 2 {
		t.Fatalf("%d roots after the system bundle changed", len(b.Certs()))
	}
}

func TestSourceConfigErrors(t *testing.T) {
	if _, err := NewPairSource(SourceConfig{Debounce: 100 * time.Millisecond}, "", "k"); err == nil {
		t.Error("empty cert path accepted")
	}
	if _, err := NewBundleSource(SourceConfig{Debounce: 100 * time.Millisecond}, ""); err == nil {
		t.Error("empty bundle path accepted")
	}
	if _, err := NewBundleSource(SourceConfig{Debounce: -1}, "x"); err == nil {
		t.Error("negative debounce accepted")
	}
}

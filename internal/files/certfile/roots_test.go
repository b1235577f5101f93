package certfile

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
)

// NewRootSource reads "system" (any case) as the system bundle and
// anything else as a file; LoadRootSource refuses what cannot be read now.
func TestRootSource(t *testing.T) {
	sys, file := newCA(t), newCA(t)
	dir := t.TempDir()
	sysPath := filepath.Join(dir, "ca-certificates.crt")
	writeFile(t, sysPath, sys.RootPEM())
	t.Setenv("SSL_CERT_FILE", sysPath)
	filePath := filepath.Join(dir, "root-cert.pem")
	writeFile(t, filePath, file.RootPEM())
	// A file named like the keyword is read as a file through "./".
	t.Chdir(dir)
	writeFile(t, filepath.Join(dir, "system"), file.RootPEM())

	tests := []struct {
		path string
		want []byte
	}{
		{"system", sys.RootPEM()},
		{"SYSTEM", sys.RootPEM()},
		{"System", sys.RootPEM()},
		{filePath, file.RootPEM()},
		{"./system", file.RootPEM()},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			s, err := LoadRootSource(SourceConfig{Debounce: 100 * time.Millisecond}, tt.path)
			if err != nil {
				t.Fatal(err)
			}
			b, ok, _ := s.Current()
			if !ok || string(b.PEM()) != string(tt.want) {
				t.Fatalf("%s: wrong bundle", tt.path)
			}
		})
	}
	for _, bad := range []string{filepath.Join(dir, "missing.pem"), ""} {
		if _, err := LoadRootSource(SourceConfig{Debounce: 100 * time.Millisecond}, bad); err == nil {
			t.Errorf("%q: loaded", bad)
		}
	}
}

// Follow hands the current value, then every newer one, to its function.
func TestFollow(t *testing.T) {
	ca1, ca2 := newCA(t), newCA(t)
	p := filepath.Join(t.TempDir(), "root-cert.pem")
	writeFile(t, p, ca1.RootPEM())
	s, err := LoadRootSource(SourceConfig{Debounce: testDebounce}, p)
	if err != nil {
		t.Fatal(err)
	}
	runSource(t, s)
	got := make(chan *pki.Bundle, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Follow(ctx, func(b *pki.Bundle) { got <- b })
	}()
	defer func() { cancel(); <-done }()
	next := func() *pki.Bundle {
		select {
		case b := <-got:
			return b
		case <-time.After(5 * time.Second):
			t.Fatal("Follow handed nothing within 5 s")
			return nil
		}
	}
	if b := next(); !b.Certs()[0].Equal(ca1.Root()) {
		t.Fatal("first value is not the current one")
	}
	if err := os.WriteFile(p, ca2.RootPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if b := next(); !b.Certs()[0].Equal(ca2.Root()) {
		t.Fatal("second value is not the new bundle")
	}
}

package fileprovider

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/secretmanager"
)

func FuzzSplitPair(f *testing.F) {
	for _, s := range []string{"a~b", "~", "a~", "~b", "a~b~c", "", "/etc/certs/cert-chain.pem~/etc/certs/key.pem"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, k, err := splitPair(s)
		if err != nil {
			return
		}
		if c == "" || k == "" || c+"~"+k != s || strings.Contains(c, "~") || strings.Contains(k, "~") {
			t.Fatalf("splitPair(%q) = %q, %q", s, c, k)
		}
	})
}

// FuzzResourceName: any name a client sends is served or refused with an
// error wrapping ErrUnknownResource, never a panic, and holds nothing once
// released.
func FuzzResourceName(f *testing.F) {
	dir := f.TempDir()
	root := filepath.Join(dir, "root.pem")
	ca, err := localca.New(localca.Config{Name: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(root, ca.RootPEM(), 0o644); err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		"file-root:" + root, "file-root:", "file-root:system", "file-root:SYSTEM", "file-root:" + dir,
		"file-cert:" + root + "~" + root, "file-cert:~", "file-cert:a~b~c", "file-root:/proc/self/status",
		"file-root:\x00", "other", "",
	} {
		f.Add(s)
	}
	p := New(Config{MaxResources: 4})
	f.Fuzz(func(t *testing.T, name string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		ch, release := p.Watch(name)
		s, err := p.Secret(ctx, name)
		switch {
		case err != nil && !errors.Is(err, secretmanager.ErrUnknownResource):
			t.Fatalf("%q: error %v does not wrap ErrUnknownResource", name, err)
		case err == nil && s.Name != name:
			t.Fatalf("%q: secret named %q", name, s.Name)
		case err != nil && ch != nil:
			t.Fatalf("%q: watched but not served: %v", name, err)
		}
		release()
		if n := p.Held(); n != 0 {
			t.Fatalf("%q: %d names held after release", name, n)
		}
	})
}

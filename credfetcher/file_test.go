package credfetcher

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func write(t testing.TB, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestFileToken(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		want    string
		noToken bool // error wraps ErrNoToken
		bad     bool // some other error
	}{
		{name: "plain", data: "eyJhbGciOi.payload.sig", want: "eyJhbGciOi.payload.sig"},
		{name: "trailing newline", data: "tok\n", want: "tok"},
		{name: "surrounding white space", data: " \t tok \r\n", want: "tok"},
		{name: "empty", data: "", noToken: true},
		{name: "only white space", data: " \n\t", noToken: true},
		{name: "two tokens", data: "s3cr3t-one\ns3cr3t-two\n", bad: true},
		{name: "inner space", data: "s3cr3t en", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "istio-token")
			write(t, p, tt.data)
			got, err := File{Path: p}.Token(context.Background())
			switch {
			case tt.noToken:
				if !errors.Is(err, ErrNoToken) {
					t.Fatalf("Token() = %q, %v; want ErrNoToken", got, err)
				}
			case tt.bad:
				if err == nil || errors.Is(err, ErrNoToken) {
					t.Fatalf("Token() = %q, %v; want a malformed-file error", got, err)
				}
				if strings.Contains(err.Error(), "s3cr3t") {
					t.Errorf("error %q repeats the file's content", err)
				}
			default:
				if err != nil || got != tt.want {
					t.Fatalf("Token() = %q, %v; want %q", got, err, tt.want)
				}
			}
		})
	}
}

func TestFileMissingIsNoToken(t *testing.T) {
	p := filepath.Join(t.TempDir(), "absent")
	_, err := File{Path: p}.Token(context.Background())
	if !errors.Is(err, ErrNoToken) {
		t.Fatalf("error %v, want ErrNoToken", err)
	}
	if !strings.Contains(err.Error(), p) {
		t.Errorf("error %q does not name the path", err)
	}
}

func TestFileUnreadableIsAnError(t *testing.T) {
	dir := t.TempDir()
	_, err := File{Path: dir}.Token(context.Background()) // a directory
	if err == nil || errors.Is(err, ErrNoToken) {
		t.Fatalf("reading a directory: %v, want a read error", err)
	}
}

func TestFileIsReadOnEveryCall(t *testing.T) {
	p := filepath.Join(t.TempDir(), "istio-token")
	f := File{Path: p}
	for _, tok := range []string{"first", "second", "third"} {
		write(t, p, tok+"\n")
		got, err := f.Token(context.Background())
		if err != nil || got != tok {
			t.Fatalf("Token() = %q, %v; want %q", got, err, tok)
		}
	}
	// A kubelet-style rotation: the file is replaced by a rename.
	tmp := p + ".new"
	write(t, tmp, "renamed")
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	if got, err := f.Token(context.Background()); err != nil || got != "renamed" {
		t.Fatalf("after rename Token() = %q, %v", got, err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Token(context.Background()); !errors.Is(err, ErrNoToken) {
		t.Fatalf("after removal: %v, want ErrNoToken", err)
	}
}

func TestFileConcurrentUse(t *testing.T) {
	p := filepath.Join(t.TempDir(), "istio-token")
	write(t, p, "tok")
	f := File{Path: p}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := f.Token(context.Background())
			if err == nil && got != "tok" {
				err = errors.New("wrong token " + got)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// FuzzFileToken writes arbitrary bytes as a token file: the fetcher must
// never panic, and a token it accepts is non-empty with no white space.
func FuzzFileToken(f *testing.F) {
	for _, s := range []string{"tok", "tok\n", " a b ", "", "\n\n", "eyJ.x.y\r\n", "a\x00b", "\xff\xfe"} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "token")
		write(t, p, string(data))
		tok, err := File{Path: p}.Token(context.Background())
		if err != nil {
			return
		}
		if tok == "" || strings.ContainsAny(tok, " \t\r\n") {
			t.Fatalf("accepted token %q", tok)
		}
		if !strings.Contains(string(data), tok) {
			t.Fatalf("token %q is not in the file", tok)
		}
	})
}

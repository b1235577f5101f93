package atomicfile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.json")
	for _, perm := range []os.FileMode{0o600, 0o644} {
		if err := Write(p, []byte("data"), perm); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != perm {
			t.Fatalf("mode %v, want %v", fi.Mode().Perm(), perm)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left behind: %v", entries)
	}
	if err := Write(filepath.Join(dir, "missing", "f"), nil, 0o600); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

func TestWriteIfChanged(t *testing.T) {
	p := filepath.Join(t.TempDir(), "key.pem")
	if w, err := WriteIfChanged(p, []byte("a"), 0o600); err != nil || !w {
		t.Fatalf("first write: %v, %v", w, err)
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if w, err := WriteIfChanged(p, []byte("a"), 0o600); err != nil || w {
		t.Fatalf("same content written again: %v, %v", w, err)
	}
	fi, _ := os.Stat(p)
	if !fi.ModTime().Equal(old) {
		t.Fatal("unchanged file was rewritten")
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode not corrected: %v", fi.Mode().Perm())
	}
	if w, err := WriteIfChanged(p, []byte("b"), 0o600); err != nil || !w {
		t.Fatalf("changed content not written: %v, %v", w, err)
	}
}

// Readers racing a writer see whole files only.
func TestReadersSeeWholeFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	contents := [][]byte{bytes.Repeat([]byte("a"), 64<<10), bytes.Repeat([]byte("b"), 1<<10)}
	if err := Write(p, contents[0], 0o644); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 1)
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			got, err := os.ReadFile(p)
			if err != nil || !(bytes.Equal(got, contents[0]) || bytes.Equal(got, contents[1])) {
				select {
				case errs <- fmt.Errorf("read %d bytes, %v", len(got), err):
				default:
				}
				return
			}
		}
	})
	for i := range 300 {
		if err := Write(p, contents[i%2], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

func TestPrepareCommitAbort(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	pa, err := Prepare(a, []byte("A"), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := Prepare(b, []byte("B"), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a); !os.IsNotExist(err) {
		t.Fatal("target exists before Commit")
	}
	if err := pa.Commit(); err != nil {
		t.Fatal(err)
	}
	pb.Abort()
	SyncDir(dir)
	if got, _ := os.ReadFile(a); string(got) != "A" {
		t.Fatalf("a holds %q", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("entries %v, want only a", entries)
	}
}

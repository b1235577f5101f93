package regularfile

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	if err := os.WriteFile(small, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 11), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(small, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path string
		want       string
		err        error
	}{
		{"regular", small, "abc", nil},
		{"symlink to regular", link, "abc", nil},
		{"at the limit", big, "", nil},
		{"fifo without a writer does not block", fifo, "", ErrNotRegular},
		{"device", "/dev/zero", "", ErrNotRegular},
		{"directory", dir, "", ErrNotRegular},
		{"missing", filepath.Join(dir, "missing"), "", os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			max := int64(11)
			got, err := Read(tt.path, max)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("error %v, want %v", err, tt.err)
				}
				var pe *os.PathError
				if !errors.As(err, &pe) {
					t.Errorf("error %v is not a PathError", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.want != "" && string(got) != tt.want {
				t.Fatalf("got %q", got)
			}
		})
	}
	if _, err := Read(big, 10); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the limit: %v", err)
	}
}

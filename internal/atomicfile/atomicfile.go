// Package atomicfile replaces files so that a reader sees either the old
// content or the new, never a mix or a truncated file: the data goes to a
// temporary file in the same directory, is synced, and is renamed over the
// target; then the directory is synced so the rename survives a crash.
//
// It holds no state; concurrent writers of the same path each leave a
// complete file, the last rename winning.
package atomicfile

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, with permissions perm.
func Write(path string, data []byte, perm fs.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("creating temporary file for %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	// Chmod is not subject to the umask, so perm is exact.
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("setting mode of %s: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync() // best effort: not every file system syncs directories
		_ = d.Close()
	}
	return nil
}

// WriteIfChanged replaces path with data unless it already holds exactly
// data; if only its mode differs from perm, the mode is corrected in place.
// It reports whether the content was written.
func WriteIfChanged(path string, data []byte, perm fs.FileMode) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		fi, err := os.Stat(path)
		if err != nil {
			return false, fmt.Errorf("checking %s: %w", path, err)
		}
		if fi.Mode().Perm() != perm {
			if err := os.Chmod(path, perm); err != nil {
				return false, fmt.Errorf("setting mode of %s: %w", path, err)
			}
		}
		return false, nil
	}
	// Missing, different or unreadable: replace it (Write says why if it
	// cannot).
	if err := Write(path, data, perm); err != nil {
		return false, err
	}
	return true, nil
}

// Package atomicfile replaces files so that a reader sees either the old
// content or the new, never a mix or a truncated file: the data goes to a
// temporary file in the same directory, is synced, and is renamed over the
// target; then the directory is synced so the rename survives a crash.
//
// Prepare and Commit split the two steps, so that several files can be
// written and synced first and then renamed back to back, keeping the moment
// in which a reader sees some files new and others old as short as possible.
//
// It holds no state; concurrent writers of the same path each leave a
// complete file, the last rename winning.
package atomicfile

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Pending is a temporary file, written and synced, waiting to replace its
// target.
type Pending struct {
	path, tmp string
}

// Prepare writes data with permissions perm to a synced temporary file next
// to path. Call Commit to put it in place or Abort to remove it.
func Prepare(path string, data []byte, perm fs.FileMode) (_ *Pending, err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("creating temporary file for %s: %w", path, err)
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
		return nil, fmt.Errorf("setting mode of %s: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		return nil, fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("syncing %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("closing %s: %w", tmp, err)
	}
	return &Pending{path: path, tmp: tmp}, nil
}

// SetGroup gives the temporary file the group gid, before Commit puts it in
// place, so that the file never appears with another group.
func (p *Pending) SetGroup(gid int) error {
	if err := os.Lchown(p.tmp, -1, gid); err != nil {
		return fmt.Errorf("setting the group of %s: %w", p.path, err)
	}
	return nil
}

// Commit renames the temporary file over the target. The caller syncs the
// directory (SyncDir) once after its last Commit.
func (p *Pending) Commit() error {
	if err := os.Rename(p.tmp, p.path); err != nil {
		_ = os.Remove(p.tmp)
		return fmt.Errorf("replacing %s: %w", p.path, err)
	}
	return nil
}

// Abort removes the temporary file.
func (p *Pending) Abort() { _ = os.Remove(p.tmp) }

// SyncDir makes renames in dir durable. Best effort: not every file system
// can sync a directory.
func SyncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}

// Write replaces path with data, with permissions perm.
func Write(path string, data []byte, perm fs.FileMode) error {
	p, err := Prepare(path, data, perm)
	if err != nil {
		return err
	}
	if err := p.Commit(); err != nil {
		return err
	}
	SyncDir(filepath.Dir(path))
	return nil
}

// Unchanged reports whether path already holds exactly data. If it does but
// its mode is not perm, the mode is corrected in place. A symbolic link at
// path is never followed (it is opened with O_NOFOLLOW): it counts as
// changed, so that Write replaces the link itself, and its target is neither
// read nor chmod-ed.
func Unchanged(path string, data []byte, perm fs.FileMode) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		// Missing, a link, or unreadable: to be replaced.
		return false, nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != int64(len(data)) {
		return false, nil
	}
	old, err := io.ReadAll(io.LimitReader(f, int64(len(data))+1))
	if err != nil || !bytes.Equal(old, data) {
		return false, nil
	}
	if fi.Mode().Perm() != perm {
		if err := f.Chmod(perm); err != nil {
			return false, fmt.Errorf("setting mode of %s: %w", path, err)
		}
	}
	return true, nil
}

// WriteIfChanged replaces path with data unless it already holds exactly
// data (see Unchanged). It reports whether the content was written.
func WriteIfChanged(path string, data []byte, perm fs.FileMode) (bool, error) {
	same, err := Unchanged(path, data, perm)
	if err != nil || same {
		return false, err
	}
	if err := Write(path, data, perm); err != nil {
		return false, err
	}
	return true, nil
}

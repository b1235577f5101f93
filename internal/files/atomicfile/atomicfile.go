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
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Pending is a temporary file, written and synced, waiting to replace its
// target.
type Pending struct {
	path, tmp string
	// dir, when set, is the directory held open that name and tmpName
	// are relative to (Dir.Prepare).
	dir           *Dir
	name, tmpName string
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
	if p.dir != nil {
		return p.dir.Lchown(p.tmpName, gid)
	}
	if err := os.Lchown(p.tmp, -1, gid); err != nil {
		return fmt.Errorf("setting the group of %s: %w", p.path, err)
	}
	return nil
}

// SetOwner gives the temporary file the owner uid and group gid, before
// Commit puts it in place.
func (p *Pending) SetOwner(uid, gid int) error {
	var err error
	if p.dir != nil {
		err = unix.Fchownat(p.dir.fd(), p.tmpName, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
	} else {
		err = os.Lchown(p.tmp, uid, gid)
	}
	if err != nil {
		return fmt.Errorf("setting the owner of %s: %w", p.path, err)
	}
	return nil
}

// Commit renames the temporary file over the target. The caller syncs the
// directory (SyncDir) once after its last Commit.
func (p *Pending) Commit() error {
	if p.dir != nil {
		if err := unix.Renameat(p.dir.fd(), p.tmpName, p.dir.fd(), p.name); err != nil {
			p.Abort()
			return fmt.Errorf("replacing %s: %w", p.path, err)
		}
		return nil
	}
	if err := os.Rename(p.tmp, p.path); err != nil {
		_ = os.Remove(p.tmp)
		return fmt.Errorf("replacing %s: %w", p.path, err)
	}
	return nil
}

// Abort removes the temporary file.
func (p *Pending) Abort() {
	if p.dir != nil {
		_ = unix.Unlinkat(p.dir.fd(), p.tmpName, 0)
		return
	}
	_ = os.Remove(p.tmp)
}

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
	return unchanged(f, data, perm)
}

// unchanged is Unchanged for the open file f, which it closes.
func unchanged(f *os.File, data []byte, perm fs.FileMode) (bool, error) {
	defer f.Close()
	path := f.Name()
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

// Dir is a directory held open: the files Dir writes are named relative to
// it (openat, renameat), so once it is opened, a directory or link put in
// the place of the path (or of any directory above it) redirects nothing.
// What the caller checks with Stat is the directory the files go into.
type Dir struct {
	f    *os.File
	path string
}

// OpenDir opens the directory path without following a symbolic link in its
// last component (a link there fails with an error saying so); directories
// above it are resolved once, now.
func OpenDir(path string) (*Dir, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		// With O_DIRECTORY, Linux says ENOTDIR for a link too: Lstat (for
		// the message only) tells which.
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
				return nil, fmt.Errorf("%s is a symbolic link: name the directory itself", path)
			}
			return nil, fmt.Errorf("%s is not a directory", path)
		}
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return &Dir{f: os.NewFile(uintptr(fd), path), path: path}, nil
}

// Path is the path the directory was opened by.
func (d *Dir) Path() string { return d.path }

// File is the open directory, for Stat, Chmod, Chown and the like.
func (d *Dir) File() *os.File { return d.f }

// Close closes the directory.
func (d *Dir) Close() error { return d.f.Close() }

// Sync makes renames in the directory durable (best effort, as SyncDir).
func (d *Dir) Sync() { _ = d.f.Sync() }

func (d *Dir) fd() int { return int(d.f.Fd()) }

// Prepare writes data with permissions perm to a synced temporary file of
// the directory, created there (never through a link), to replace name.
func (d *Dir) Prepare(name string, data []byte, perm fs.FileMode) (_ *Pending, err error) {
	var (
		fd  int
		tmp string
	)
	for range 100 {
		tmp = "." + name + ".tmp-" + strconv.FormatUint(uint64(rand.Uint32()), 10)
		fd, err = unix.Openat(d.fd(), tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("creating temporary file for %s: %w", d.join(name), err)
	}
	f := os.NewFile(uintptr(fd), d.join(tmp))
	p := &Pending{path: d.join(name), tmp: d.join(tmp), dir: d, name: name, tmpName: tmp}
	defer func() {
		if err != nil {
			_ = f.Close()
			p.Abort()
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return nil, fmt.Errorf("setting mode of %s: %w", p.tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		return nil, fmt.Errorf("writing %s: %w", p.tmp, err)
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("syncing %s: %w", p.tmp, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("closing %s: %w", p.tmp, err)
	}
	return p, nil
}

// Unchanged is the package's Unchanged for the file name of the directory.
func (d *Dir) Unchanged(name string, data []byte, perm fs.FileMode) (bool, error) {
	fd, err := unix.Openat(d.fd(), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, nil
	}
	return unchanged(os.NewFile(uintptr(fd), d.join(name)), data, perm)
}

// Lchown gives the file name of the directory (a link itself, never its
// target) the group gid.
func (d *Dir) Lchown(name string, gid int) error {
	if err := unix.Fchownat(d.fd(), name, -1, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("setting the group of %s: %w", d.join(name), err)
	}
	return nil
}

// Names lists the names in the directory.
func (d *Dir) Names() ([]string, error) {
	// A second descriptor, so that reading does not move the held one's
	// offset.
	fd, err := unix.Openat(d.fd(), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	return f.Readdirnames(-1)
}

// RemoveRegular removes the file name of the directory if it is a regular
// file, and reports whether it did.
func (d *Dir) RemoveRegular(name string) bool {
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	return unix.Unlinkat(d.fd(), name, 0) == nil
}

func (d *Dir) join(name string) string { return filepath.Join(d.path, name) }

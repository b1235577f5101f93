package filewatch

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// fsOps changes files the way the scenarios need. realFS only changes
// them; fakeInotify also delivers the events the kernel would.
type fsOps interface {
	write(p, content string)
	rename(from, to string)
	remove(p string)
	removeAll(p string)
	mkdirAll(d string)
	symlink(target, link string)
	touch(p string)
}

// realFS changes real files; a real inotify instance sees them.
type realFS struct{ t *testing.T }

func (r realFS) write(p, content string) {
	r.t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func (r realFS) rename(from, to string) {
	r.t.Helper()
	if err := os.Rename(from, to); err != nil {
		r.t.Fatal(err)
	}
}

func (r realFS) remove(p string) {
	r.t.Helper()
	if err := os.Remove(p); err != nil {
		r.t.Fatal(err)
	}
}

func (r realFS) removeAll(p string) {
	r.t.Helper()
	if err := os.RemoveAll(p); err != nil {
		r.t.Fatal(err)
	}
}

func (r realFS) mkdirAll(d string) {
	r.t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		r.t.Fatal(err)
	}
}

func (r realFS) symlink(target, link string) {
	r.t.Helper()
	if err := os.Symlink(target, link); err != nil {
		r.t.Fatal(err)
	}
}

func (r realFS) touch(p string) {
	r.t.Helper()
	now := time.Now()
	if err := os.Chtimes(p, now, now); err != nil {
		r.t.Fatal(err)
	}
}

// fakeInotify stands for the kernel's inotify inside a synctest bubble,
// where a real instance's reader is not durably blocked. Its changes are
// made to real files, and it then delivers the events a real instance would,
// on channels of the bubble, to the watches the hub added: an event in a
// directory that is not watched reaches no one, and a watched directory that
// is removed loses its watch (a directory made again under its path needs
// a new one), as with the kernel. The test drives it; the hub opens and
// closes it through open.
type fakeInotify struct {
	t *testing.T

	mu     sync.Mutex
	be     *fakeBackend // the open instance; nil when none is
	opens  int
	refuse error            // open fails with it (no instance to be had)
	deny   map[string]error // Add fails with it for these directories
}

func newFakeInotify(t *testing.T) *fakeInotify {
	return &fakeInotify{t: t, deny: map[string]error{}}
}

func (k *fakeInotify) open() (backend, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.refuse != nil {
		return nil, k.refuse
	}
	if k.be != nil {
		k.t.Error("a second instance opened while one is open")
	}
	k.opens++
	k.be = &fakeBackend{
		k:       k,
		events:  make(chan fsnotify.Event),
		errs:    make(chan error),
		watched: map[string]bool{},
	}
	return k.be, nil
}

func (k *fakeInotify) setRefuse(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refuse = err
}

// instance returns the open instance, or nil.
func (k *fakeInotify) instance() *fakeBackend {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.be
}

func (k *fakeInotify) openCount() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.opens
}

// overflow reports lost events, as the kernel does when its queue overflows.
func (k *fakeInotify) overflow() {
	if be := k.instance(); be != nil {
		be.sendMu.Lock()
		defer be.sendMu.Unlock()
		if !be.closed {
			be.errs <- fsnotify.ErrEventOverflow
		}
	}
}

// fakeEvent is an event about name, seen by the watch of dir.
type fakeEvent struct {
	dir, name string
	op        fsnotify.Op
	self      bool // dir itself was removed: its watch ends
}

// resolve returns d with its symlinks resolved, as the hub adds it.
func resolve(d string) string {
	if real, err := filepath.EvalSymlinks(d); err == nil {
		return real
	}
	return filepath.Clean(d)
}

// in is an event about p seen by the watch of p's directory.
func in(p string, op fsnotify.Op) fakeEvent {
	dir := resolve(filepath.Dir(p))
	return fakeEvent{dir: dir, name: filepath.Join(dir, filepath.Base(p)), op: op}
}

// emit delivers evs to the watches that see them.
func (k *fakeInotify) emit(evs ...fakeEvent) {
	for _, ev := range evs {
		be := k.instance()
		if be == nil {
			continue
		}
		if !be.isWatched(ev.dir) {
			continue
		}
		be.send(fsnotify.Event{Name: ev.name, Op: ev.op})
		if ev.self {
			be.unwatch(ev.dir)
		}
	}
}

func (k *fakeInotify) write(p, content string) {
	k.t.Helper()
	evs := []fakeEvent{in(p, fsnotify.Write)}
	if _, err := os.Lstat(p); err != nil {
		evs = slices.Insert(evs, 0, in(p, fsnotify.Create))
	}
	realFS{k.t}.write(p, content)
	k.emit(evs...)
}

func (k *fakeInotify) rename(from, to string) {
	k.t.Helper()
	if fi, err := os.Lstat(from); err == nil && fi.IsDir() {
		k.t.Fatal("fakeInotify: renaming a directory is not emulated")
	}
	evs := []fakeEvent{in(from, fsnotify.Rename), in(to, fsnotify.Create)}
	realFS{k.t}.rename(from, to)
	k.emit(evs...)
}

// removed returns the events of removing p, a file or an empty directory.
func removed(p string, isDir bool) []fakeEvent {
	var evs []fakeEvent
	if isDir {
		d := resolve(p)
		evs = append(evs, fakeEvent{dir: d, name: d, op: fsnotify.Remove, self: true})
	}
	return append(evs, in(p, fsnotify.Remove))
}

func (k *fakeInotify) remove(p string) {
	k.t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		k.t.Fatal(err)
	}
	evs := removed(p, fi.IsDir())
	realFS{k.t}.remove(p)
	k.emit(evs...)
}

func (k *fakeInotify) removeAll(p string) {
	k.t.Helper()
	var evs []fakeEvent
	err := filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// Contents first: prepend, so the walk's order is reversed.
		evs = append(removed(path, d.IsDir()), evs...)
		return nil
	})
	if err != nil {
		k.t.Fatal(err)
	}
	realFS{k.t}.removeAll(p)
	k.emit(evs...)
}

func (k *fakeInotify) mkdirAll(d string) {
	k.t.Helper()
	var missing []string
	for cur := filepath.Clean(d); ; cur = filepath.Dir(cur) {
		if _, err := os.Lstat(cur); err == nil || cur == filepath.Dir(cur) {
			break
		}
		missing = append(missing, cur)
	}
	realFS{k.t}.mkdirAll(d)
	for _, m := range slices.Backward(missing) {
		k.emit(in(m, fsnotify.Create))
	}
}

func (k *fakeInotify) symlink(target, link string) {
	k.t.Helper()
	realFS{k.t}.symlink(target, link)
	k.emit(in(link, fsnotify.Create))
}

func (k *fakeInotify) touch(p string) {
	k.t.Helper()
	realFS{k.t}.touch(p)
	k.emit(in(p, fsnotify.Chmod))
}

// fakeBackend is one open instance of a fakeInotify.
type fakeBackend struct {
	k      *fakeInotify
	events chan fsnotify.Event
	errs   chan error

	// sendMu orders sends with Close; it is never taken by the hub while it
	// holds its own mutex (the hub closes without it).
	sendMu sync.Mutex
	closed bool

	// watchMu guards watched; Add and Remove take it under the hub's
	// mutex, so it is never held while sending.
	watchMu sync.Mutex
	watched map[string]bool
}

func (b *fakeBackend) Add(dir string) error {
	b.k.mu.Lock()
	err := b.k.deny[dir]
	b.k.mu.Unlock()
	if err != nil {
		return err
	}
	if fi, err := os.Stat(dir); err != nil {
		return err
	} else if !fi.IsDir() {
		return errors.New("fakeInotify: not a directory")
	}
	b.watchMu.Lock()
	defer b.watchMu.Unlock()
	b.watched[dir] = true
	return nil
}

func (b *fakeBackend) Remove(dir string) error {
	b.watchMu.Lock()
	defer b.watchMu.Unlock()
	if !b.watched[dir] {
		return fsnotify.ErrNonExistentWatch
	}
	delete(b.watched, dir)
	return nil
}

func (b *fakeBackend) Close() error {
	b.sendMu.Lock()
	defer b.sendMu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	close(b.events)
	close(b.errs)
	b.k.mu.Lock()
	if b.k.be == b {
		b.k.be = nil
	}
	b.k.mu.Unlock()
	return nil
}

func (b *fakeBackend) Events() <-chan fsnotify.Event { return b.events }
func (b *fakeBackend) Errors() <-chan error          { return b.errs }

func (b *fakeBackend) isWatched(dir string) bool {
	b.watchMu.Lock()
	defer b.watchMu.Unlock()
	return b.watched[dir]
}

func (b *fakeBackend) unwatch(dir string) {
	b.watchMu.Lock()
	defer b.watchMu.Unlock()
	delete(b.watched, dir)
}

// send hands ev to the hub's reader, which takes it unless the instance was
// closed.
func (b *fakeBackend) send(ev fsnotify.Event) {
	b.sendMu.Lock()
	defer b.sendMu.Unlock()
	if !b.closed {
		b.events <- ev
	}
}

// watchedDirs returns the directories the open instance watches.
func (k *fakeInotify) watchedDirs() []string {
	be := k.instance()
	if be == nil {
		return nil
	}
	be.watchMu.Lock()
	defer be.watchMu.Unlock()
	return slices.Sorted(maps.Keys(be.watched))
}

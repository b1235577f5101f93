package filewatch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/fsnotify/fsnotify"
)

// backend is the part of an fsnotify watcher the hub uses, so that tests can
// put a failing one in its place.
type backend interface {
	Add(dir string) error
	Remove(dir string) error
	Close() error
	Events() <-chan fsnotify.Event
	Errors() <-chan error
}

type fsnotifyBackend struct{ w *fsnotify.Watcher }

func openFSNotify() (backend, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	return fsnotifyBackend{w}, nil
}

func (b fsnotifyBackend) Add(dir string) error          { return b.w.Add(dir) }
func (b fsnotifyBackend) Remove(dir string) error       { return b.w.Remove(dir) }
func (b fsnotifyBackend) Close() error                  { return b.w.Close() }
func (b fsnotifyBackend) Events() <-chan fsnotify.Event { return b.w.Events }
func (b fsnotifyBackend) Errors() <-chan error          { return b.w.Errors }

// processHub is the hub every Watcher of the process uses unless its Config
// names another (tests do).
var processHub = newHub(openFSNotify)

// hub shares one fsnotify watcher (one inotify instance) among every Watcher
// of the process. Directory watches are reference-counted by the Watchers
// that need them; the fsnotify watcher is opened with the first directory
// and closed, with the goroutine that reads it, when the last one is
// released. Events are handed to the Watchers of the directory they happened
// in as merged signals; each Watcher debounces and re-reads on its own.
//
// Locking: mu guards every field; it is never held while a Watcher's
// channel is sent to (those sends do not block anyway) nor while waiting for
// the reader goroutine to end.
type hub struct {
	open func() (backend, error)

	mu   sync.Mutex
	be   backend       // nil while no directory is watched
	done chan struct{} // closed when be's reader goroutine has returned
	dirs map[string]*dirWatch
}

// dirWatch is one watched directory.
type dirWatch struct {
	subs map[subscriber]struct{}
	// id is the directory's device and inode when the watch was added; a
	// directory deleted and made again under the same path is a new one and
	// needs a new watch (the old watch died with the old directory).
	id fileID
	// stale is set when an event says the directory itself was removed or
	// renamed away.
	stale bool
}

type fileID struct{ dev, ino uint64 }

// subscriber is told, by a merged signal that never blocks, that something
// happened in or to a directory it watches: a Watcher or a DirWatch.
type subscriber interface{ notify() }

func idOf(dir string) (fileID, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return fileID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, nil
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}, nil
}

func newHub(open func() (backend, error)) *hub {
	return &hub{open: open, dirs: map[string]*dirWatch{}}
}

// errNoInstance wraps the failure to open the shared fsnotify watcher.
var errNoInstance = errors.New("no file watcher available")

// ensure makes sure dir is watched for w: it adds w as a subscriber and
// (re-)adds the directory's watch when there is none, when the directory was
// removed, or when the path now names another directory. An error means dir
// is not watched for w (w is not subscribed): the caller polls instead.
func (h *hub) ensure(dir string, w subscriber) error {
	h.mu.Lock()
	err := h.ensureLocked(dir, w)
	var (
		be   backend
		done chan struct{}
	)
	if err != nil {
		be, done = h.closeIfIdleLocked()
	}
	h.mu.Unlock()
	if be != nil {
		_ = be.Close()
		<-done
	}
	return err
}

func (h *hub) ensureLocked(dir string, w subscriber) error {
	if h.be == nil {
		be, err := h.open()
		if err != nil {
			return fmt.Errorf("%w: %w", errNoInstance, err)
		}
		h.be, h.done = be, make(chan struct{})
		go h.dispatch(be, h.done)
	}
	id, err := idOf(dir)
	if err != nil {
		h.releaseLocked(dir, w)
		return err
	}
	dw := h.dirs[dir]
	if dw != nil && !dw.stale && dw.id == id {
		dw.subs[w] = struct{}{}
		return nil
	}
	// Adding again over a dead watch is safe: fsnotify replaces its
	// record of the path.
	if err := h.be.Add(dir); err != nil {
		h.releaseLocked(dir, w)
		return err
	}
	if dw == nil {
		dw = &dirWatch{subs: map[subscriber]struct{}{}}
		h.dirs[dir] = dw
	}
	dw.id, dw.stale = id, false
	dw.subs[w] = struct{}{}
	return nil
}

// release drops w's interest in dir; the last one removes the watch, and
// the last watch closes the fsnotify watcher.
func (h *hub) release(dir string, w subscriber) {
	h.mu.Lock()
	h.releaseLocked(dir, w)
	be, done := h.closeIfIdleLocked()
	h.mu.Unlock()
	if be != nil {
		_ = be.Close()
		<-done
	}
}

func (h *hub) releaseLocked(dir string, w subscriber) {
	dw := h.dirs[dir]
	if dw == nil {
		return
	}
	delete(dw.subs, w)
	if len(dw.subs) > 0 {
		return
	}
	delete(h.dirs, dir)
	if h.be != nil {
		// The directory may be gone already; its watch went with it.
		_ = h.be.Remove(dir)
	}
}

// closeIfIdleLocked detaches the fsnotify watcher when no directory is
// watched any more; the caller closes it and waits on done without h.mu.
func (h *hub) closeIfIdleLocked() (backend, chan struct{}) {
	if len(h.dirs) > 0 || h.be == nil {
		return nil, nil
	}
	be, done := h.be, h.done
	h.be, h.done = nil, nil
	return be, done
}

// releaseAll drops every directory watched for w.
func (h *hub) releaseAll(w subscriber, dirs []string) {
	h.mu.Lock()
	for _, d := range dirs {
		h.releaseLocked(d, w)
	}
	be, done := h.closeIfIdleLocked()
	h.mu.Unlock()
	if be != nil {
		_ = be.Close()
		<-done
	}
}

// dispatch hands be's events to the Watchers of the directory they concern
// until be is closed.
func (h *hub) dispatch(be backend, done chan struct{}) {
	defer close(done)
	events, errs := be.Events(), be.Errors()
	for events != nil || errs != nil {
		select {
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			h.deliver(ev)
		case _, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			// An overflow or a read error may have lost events: everyone
			// re-reads.
			h.broadcast()
		}
	}
}

func (h *hub) deliver(ev fsnotify.Event) {
	name := filepath.Clean(ev.Name)
	var ws []subscriber
	h.mu.Lock()
	if dw := h.dirs[name]; dw != nil {
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			dw.stale = true
		}
		for w := range dw.subs {
			ws = append(ws, w)
		}
	}
	if dw := h.dirs[filepath.Dir(name)]; dw != nil {
		for w := range dw.subs {
			ws = append(ws, w)
		}
	}
	h.mu.Unlock()
	for _, w := range ws {
		w.notify()
	}
}

func (h *hub) broadcast() {
	seen := map[subscriber]bool{}
	h.mu.Lock()
	for _, dw := range h.dirs {
		for w := range dw.subs {
			seen[w] = true
		}
	}
	h.mu.Unlock()
	for w := range seen {
		w.notify()
	}
}

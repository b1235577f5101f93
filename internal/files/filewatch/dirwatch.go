package filewatch

import "path/filepath"

// DirWatch tells its owner that something happened in one directory or to
// the directory itself, through the process's shared inotify instance. It
// neither reads nor debounces: its owner looks at what it cares about (the
// socket listener, udslisten, checks its socket is still there).
//
// A DirWatch is made by WatchDir, which does no I/O. Watch (re-)establishes
// the watch: call it first, and again after each signal, because a
// directory removed and made again needs a new watch. Close releases it and
// is safe twice. Watch and Close are not to be called concurrently.
type DirWatch struct {
	dir    string
	hub    *hub
	events chan struct{}
	on     bool
}

// WatchDir returns a DirWatch of dir (made absolute).
func WatchDir(dir string) *DirWatch {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return &DirWatch{dir: filepath.Clean(dir), hub: processHub, events: make(chan struct{}, 1)}
}

// Events receives a merged signal after any event in or on the directory,
// and after the shared instance may have lost events (an overflow).
func (d *DirWatch) Events() <-chan struct{} { return d.events }

// Watch makes sure the directory is watched. An error means it is not (the
// directory is missing, unreadable, or no inotify instance can be had):
// the owner has to look by itself, and may call Watch again later.
func (d *DirWatch) Watch() error {
	if err := d.hub.ensure(d.dir, d); err != nil {
		d.on = false
		return err
	}
	d.on = true
	return nil
}

// Close releases the watch.
func (d *DirWatch) Close() {
	if d.on {
		d.hub.release(d.dir, d)
		d.on = false
	}
}

func (d *DirWatch) notify() {
	select {
	case d.events <- struct{}{}:
	default:
	}
}

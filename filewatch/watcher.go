package filewatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
	"k8s.io/utils/clock"
)

// DefaultDebounce is FILE_DEBOUNCE_DURATION's default.
const DefaultDebounce = 100 * time.Millisecond

// maxDelayFactor bounds how long a burst of events can postpone a signal: at
// most maxDelayFactor debounce periods after the first event of the burst,
// even if events keep coming.
const maxDelayFactor = 10

// maxSymlinkHops bounds how far a symlink chain is followed.
const maxSymlinkHops = 40

// ErrRunTwice is returned by a second call to Run.
var ErrRunTwice = errors.New("filewatch: Run called more than once")

// Config configures a Watcher.
type Config struct {
	// Paths are the files to watch. Each may be a symlink or a chain of
	// symlinks. Relative paths are made absolute against the working
	// directory when New is called. Required.
	Paths []string
	// Debounce is how long the watched directories must be quiet after an
	// event before the files are re-read (FILE_DEBOUNCE_DURATION). A burst
	// that never goes quiet is cut off after ten debounce periods. Zero means
	// DefaultDebounce; negative is an error.
	Debounce time.Duration
	// Clock times the debounce. Default clock.RealClock{}.
	Clock clock.Clock
	// Logger receives debug lines for events and warnings for watch errors.
	// Nil means zap.NewNop().
	Logger *zap.Logger
}

// Watcher signals when the content of its files has changed.
type Watcher struct {
	paths    []string
	debounce time.Duration
	maxDelay time.Duration
	clock    clock.Clock
	log      *zap.Logger
	changes  chan struct{}
	started  atomic.Bool
}

// New checks cfg and returns a Watcher. It starts nothing; call Run.
func New(cfg Config) (*Watcher, error) {
	if len(cfg.Paths) == 0 {
		return nil, errors.New("filewatch: no paths to watch")
	}
	if cfg.Debounce < 0 {
		return nil, fmt.Errorf("filewatch: negative debounce %s", cfg.Debounce)
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	paths := make([]string, 0, len(cfg.Paths))
	for _, p := range cfg.Paths {
		if p == "" {
			return nil, errors.New("filewatch: empty path")
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("filewatch: resolving %s: %w", p, err)
		}
		if !slices.Contains(paths, abs) {
			paths = append(paths, abs)
		}
	}
	return &Watcher{
		paths:    paths,
		debounce: cfg.Debounce,
		maxDelay: maxDelayFactor * cfg.Debounce,
		clock:    cfg.Clock,
		log:      cfg.Logger.Named("filewatch").With(zap.Strings(keyPaths, paths)),
		changes:  make(chan struct{}, 1),
	}, nil
}

// Paths returns the absolute paths being watched.
func (w *Watcher) Paths() []string { return slices.Clone(w.paths) }

// Changes receives a value after the content of a watched file changed (or a
// file appeared or disappeared), and once when Run has set up its watches, so
// that a consumer that read the files before Run started cannot miss a change
// made in between. Signals merge: at most one is pending.
func (w *Watcher) Changes() <-chan struct{} { return w.changes }

func (w *Watcher) signal() {
	select {
	case w.changes <- struct{}{}:
	default:
	}
}

// Run watches until ctx ends (returning nil) or watching becomes impossible
// (returning the error). It may be called once.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("filewatch: creating watcher: %w", err)
	}
	defer fw.Close()

	watched := map[string]bool{}
	if err := w.rewatch(fw, watched); err != nil {
		return err
	}
	last := w.fingerprint()
	w.signal()

	var (
		timer      clock.Timer
		timerC     <-chan time.Time
		burstStart time.Time
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	arm := func() {
		now := w.clock.Now()
		if timer == nil {
			burstStart = now
		} else {
			timer.Stop()
		}
		timer = w.clock.NewTimer(w.wait(burstStart, now))
		timerC = timer.C()
	}

	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return errors.New("filewatch: event channel closed")
			}
			w.log.Debug("file system event", zap.String(keyEvent, ev.String()))
			arm()
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("filewatch: error channel closed")
			}
			// An overflow means events were lost; re-reading covers it.
			w.log.Warn("file watch error, re-reading the files", zap.Error(err))
			arm()
		case <-timerC:
			timer, timerC = nil, nil
			if err := w.rewatch(fw, watched); err != nil {
				// Keep going: the directories that are watched still
				// report, and the next event retries.
				w.log.Warn("updating watched directories failed", zap.Error(err))
			}
			fp := w.fingerprint()
			if !slices.Equal(fp, last) {
				last = fp
				w.log.Debug("watched files changed")
				w.signal()
			}
		}
	}
}

// wait returns how long to wait, after an event at now, before re-reading
// the files: the debounce period, cut short so that a burst that began at
// burstStart ends by burstStart+maxDelay.
func (w *Watcher) wait(burstStart, now time.Time) time.Duration {
	rest := burstStart.Add(w.maxDelay).Sub(now)
	return max(min(w.debounce, rest), 0)
}

// rewatch makes the set of watched directories match what the paths resolve
// to now. It returns the errors of directories it could not watch.
func (w *Watcher) rewatch(fw *fsnotify.Watcher, watched map[string]bool) error {
	want := map[string]bool{}
	for _, p := range w.paths {
		for _, d := range watchDirs(p) {
			want[d] = true
		}
	}
	var errs []error
	for d := range want {
		if watched[d] {
			continue
		}
		if err := fw.Add(d); err != nil {
			errs = append(errs, fmt.Errorf("filewatch: watching %s: %w", d, err))
			continue
		}
		watched[d] = true
		w.log.Debug("watching directory", zap.String(keyDir, d))
	}
	for d := range watched {
		if !want[d] {
			// The directory may be gone already; its watch went with it.
			_ = fw.Remove(d)
			delete(watched, d)
		}
	}
	return errors.Join(errs...)
}

// watchDirs returns the directories whose events can change what path p
// resolves to or holds: the directory of p and of every link in its symlink
// chain (with directory symlinks resolved), and the directory of the file it
// finally names. A directory that does not exist is replaced by its nearest
// existing ancestor, so that its creation is noticed.
func watchDirs(p string) []string {
	var dirs []string
	add := func(d string) {
		d = existingDir(d)
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	cur := p
	for range maxSymlinkHops {
		add(filepath.Dir(cur))
		fi, err := os.Lstat(cur)
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			break
		}
		target, err := os.Readlink(cur)
		if err != nil {
			break
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(cur), target)
		}
		cur = target
	}
	if real, err := filepath.EvalSymlinks(p); err == nil {
		add(filepath.Dir(real))
	}
	return dirs
}

// existingDir returns d with symlinks resolved, or its nearest existing
// ancestor.
func existingDir(d string) string {
	for {
		if real, err := filepath.EvalSymlinks(d); err == nil {
			if fi, err := os.Stat(real); err == nil && fi.IsDir() {
				return real
			}
		}
		parent := filepath.Dir(d)
		if parent == d {
			return d
		}
		d = parent
	}
}

// fingerprint describes the current content of every path: a hash of what
// reading it returns, or why it could not be read.
func (w *Watcher) fingerprint() []string {
	out := make([]string, len(w.paths))
	for i, p := range w.paths {
		out[i] = fileFingerprint(p)
	}
	return out
}

func fileFingerprint(p string) string {
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "missing"
		}
		return "error: " + err.Error()
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "error: " + err.Error()
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

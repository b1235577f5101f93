package filewatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/internal/files/regularfile"
	"github.com/meshagent/meshagent/internal/logkeys"
	"go.uber.org/zap"
	"k8s.io/utils/clock"
)

// DefaultPollInterval is how often the files of a Watcher are re-read while
// one of its directories cannot be watched (no read permission on the
// directory, the inotify limits of the user reached, or no inotify at all).
const DefaultPollInterval = time.Second

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
	// event before the files are re-read. A burst that never goes quiet is
	// cut off after ten debounce periods. Required (positive).
	Debounce time.Duration
	// PollInterval is how often the files are re-read while a directory
	// cannot be watched. Zero means DefaultPollInterval; negative is an
	// error.
	PollInterval time.Duration
	// Clock times the debounce and the polling. Default clock.RealClock{}.
	Clock clock.Clock
	// Logger receives debug lines for events and warnings for directories
	// that cannot be watched. Nil means zap.NewNop().
	Logger *zap.Logger
	// Registerer receives the meshagent_filewatch_* metrics. Nil means they
	// are not registered. Several watchers may share one registry.
	Registerer prometheus.Registerer

	// hub replaces the process's shared watcher (tests).
	hub *hub
}

// Watcher signals when the content of its files has changed.
type Watcher struct {
	paths    []string
	debounce time.Duration
	poll     time.Duration
	maxDelay time.Duration
	clock    clock.Clock
	log      *zap.Logger
	metrics  *metrics
	hub      *hub
	changes  chan struct{}
	events   chan struct{} // from the hub: something happened in a watched directory
	started  atomic.Bool
}

// New checks cfg and returns a Watcher. It starts nothing; call Run.
func New(cfg Config) (*Watcher, error) {
	if len(cfg.Paths) == 0 {
		return nil, errors.New("filewatch: no paths to watch")
	}
	if cfg.Debounce <= 0 {
		return nil, fmt.Errorf("filewatch: Config.Debounce %s is not positive", cfg.Debounce)
	}
	if cfg.PollInterval < 0 {
		return nil, fmt.Errorf("filewatch: negative poll interval %s", cfg.PollInterval)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.hub == nil {
		cfg.hub = processHub
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
		poll:     cfg.PollInterval,
		maxDelay: maxDelayFactor * cfg.Debounce,
		clock:    cfg.Clock,
		log:      cfg.Logger.Named("filewatch").With(zap.Strings(logkeys.Paths, paths)),
		metrics:  newMetrics(cfg.Registerer),
		hub:      cfg.hub,
		changes:  make(chan struct{}, 1),
		events:   make(chan struct{}, 1),
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

// notify is called by the hub after an event in one of w's directories.
func (w *Watcher) notify() {
	select {
	case w.events <- struct{}{}:
	default:
	}
}

// dirState is what Run knows of the directories it needs.
type dirState struct {
	watched  map[string]bool  // subscribed at the hub
	failed   map[string]error // wanted but not watchable: polled
	polling  bool
	lastPoll string // the reason last logged, to log a change of reason once
}

// Run watches until ctx ends and returns nil; it never fails for what it
// finds on disk. A directory that cannot be watched makes the Watcher re-read
// its files every poll interval instead, until the directory can be watched
// again. It may be called once.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	st := &dirState{watched: map[string]bool{}, failed: map[string]error{}}
	defer func() {
		w.hub.releaseAll(w, slices.Collect(maps.Keys(st.watched)))
		if st.polling {
			w.metrics.polling.Dec()
		}
	}()
	w.rewatch(st)
	last := w.fingerprint()
	w.signal()

	var (
		timer, pollTimer   clock.Timer
		timerC, pollTimerC <-chan time.Time
		burstStart         time.Time
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if pollTimer != nil {
			pollTimer.Stop()
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
	armPoll := func() {
		switch {
		case st.polling && pollTimer == nil:
			pollTimer = w.clock.NewTimer(w.poll)
			pollTimerC = pollTimer.C()
		case !st.polling && pollTimer != nil:
			pollTimer.Stop()
			pollTimer, pollTimerC = nil, nil
		}
	}
	reread := func() {
		w.rewatch(st)
		armPoll()
		fp := w.fingerprint()
		if !slices.Equal(fp, last) {
			last = fp
			w.log.Debug("watched files changed")
			w.signal()
		}
	}
	armPoll()

	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.events:
			w.log.Debug("file system event")
			arm()
		case <-timerC:
			timer, timerC = nil, nil
			reread()
		case <-pollTimerC:
			pollTimer, pollTimerC = nil, nil
			reread()
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

// rewatch makes the set of watched directories match what the paths
// resolve to now, re-adding the watch of a directory that was deleted and
// made again. Directories that cannot be watched are recorded in st.failed,
// and st.polling says whether any is.
func (w *Watcher) rewatch(st *dirState) {
	// A directory made between computing the set and watching its parent
	// sent its event to no one: compute again until the set is stable.
	want := w.wantDirs()
	for range maxSymlinkHops {
		w.applyWatch(st, want)
		again := w.wantDirs()
		if maps.Equal(again, want) {
			break
		}
		want = again
	}
	polling := len(st.failed) > 0
	switch {
	case polling && !st.polling:
		w.metrics.polling.Inc()
	case !polling && st.polling:
		w.metrics.polling.Dec()
	}
	st.polling = polling
}

func (w *Watcher) wantDirs() map[string]bool {
	want := map[string]bool{}
	for _, p := range w.paths {
		for _, d := range watchDirs(p) {
			want[d] = true
		}
	}
	return want
}

// applyWatch subscribes to the directories in want and releases the others.
func (w *Watcher) applyWatch(st *dirState, want map[string]bool) {
	for d := range want {
		if err := w.hub.ensure(d, w); err != nil {
			delete(st.watched, d)
			if _, known := st.failed[d]; !known {
				reason := failureReason(err)
				w.metrics.failures.WithLabelValues(reason).Inc()
				w.log.Warn("directory cannot be watched; re-reading the files periodically instead",
					zap.String(logkeys.Dir, d), zap.String(logkeys.Reason, reason), zap.Duration(logkeys.PollInterval, w.poll), zap.Error(err))
			}
			st.failed[d] = err
			continue
		}
		st.watched[d] = true
		if _, was := st.failed[d]; was {
			delete(st.failed, d)
			w.log.Info("directory watched again", zap.String(logkeys.Dir, d))
		}
	}
	for d := range st.watched {
		if !want[d] {
			w.hub.release(d, w)
			delete(st.watched, d)
		}
	}
	for d := range st.failed {
		if !want[d] {
			delete(st.failed, d)
		}
	}
}

// failureReason names why a directory could not be watched, for metrics.
func failureReason(err error) string {
	switch {
	case errors.Is(err, errNoInstance):
		return "no_instance"
	case errors.Is(err, fs.ErrPermission):
		return "permission"
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EMFILE):
		return "limit"
	case errors.Is(err, fs.ErrNotExist):
		return "missing"
	}
	return "other"
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
	f, err := regularfile.Open(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "missing"
		}
		return "error: " + err.Error()
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, regularfile.MaxSize+1)); err != nil {
		return "error: " + err.Error()
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

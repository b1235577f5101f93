package certfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/files/filewatch"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
)

// Value is what a Source holds: a type that can tell whether a newly loaded
// value is the same as the held one.
type Value[T any] interface {
	Equal(T) bool
}

// SourceConfig configures a Source.
type SourceConfig struct {
	// Debounce is the quiet period after a file event before re-loading.
	// Required (positive).
	Debounce time.Duration
	// PollInterval is how often files in a directory that cannot be watched
	// are re-read. Zero means filewatch.DefaultPollInterval.
	PollInterval time.Duration
	// Clock times the debounce and is the "now" expiry is checked against.
	// Default clock.RealClock{}.
	Clock clock.Clock
	// Logger is narrowed with .Named("certfile"). Nil means zap.NewNop().
	Logger *zap.Logger
	// Registerer receives the meshagent_certfile_* and meshagent_filewatch_*
	// metrics. Nil means they are not registered. Several sources may share
	// one registry.
	Registerer prometheus.Registerer
	// Open, when set, opens the files of a pair or bundle source at every
	// load (for example beneath a directory they must not leave, whatever
	// links appear later); nil opens each path as given. The system bundle
	// is always opened as given.
	Open func(path string) (*os.File, error)
}

// Source holds the last good value loaded from a set of watched files.
type Source[T Value[T]] struct {
	name    string
	kind    string
	load    func(now time.Time) (T, error)
	clock   clock.Clock
	log     *zap.Logger
	metrics *metrics
	watcher *filewatch.Watcher
	started atomic.Bool

	loadMu sync.Mutex // serialises loads, so publications are in load order

	mu      sync.Mutex // guards the fields below
	cur     T
	ok      bool
	changed chan struct{} // closed when cur is replaced
}

// Validate reports a field of c that has no usable value.
func (c SourceConfig) Validate() error {
	if c.Debounce <= 0 {
		return fmt.Errorf("certfile: SourceConfig.Debounce %s is not positive", c.Debounce)
	}
	if c.PollInterval < 0 {
		return fmt.Errorf("certfile: SourceConfig.PollInterval %s is negative", c.PollInterval)
	}
	return nil
}

// NewSource returns a Source named name (for logs) that watches paths and
// calls load to turn them into a value. kind labels the metrics. It does no
// I/O; the first load happens in Reload or Run.
func NewSource[T Value[T]](cfg SourceConfig, name, kind string, paths []string, load func(now time.Time) (T, error)) (*Source[T], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	log := cfg.Logger.Named("certfile").With(zap.String(logkeys.Source, name))
	w, err := filewatch.New(filewatch.Config{
		Paths: paths, Debounce: cfg.Debounce, PollInterval: cfg.PollInterval,
		Clock: cfg.Clock, Logger: log, Registerer: cfg.Registerer,
	})
	if err != nil {
		return nil, fmt.Errorf("certfile %s: %w", name, err)
	}
	return &Source[T]{
		name:    name,
		kind:    kind,
		load:    load,
		clock:   cfg.Clock,
		log:     log,
		metrics: newMetrics(cfg.Registerer),
		watcher: w,
		changed: make(chan struct{}),
	}, nil
}

// NewPairSource watches a certificate chain file and its key file.
func NewPairSource(cfg SourceConfig, certPath, keyPath string) (*Source[*Pair], error) {
	if certPath == "" || keyPath == "" {
		return nil, errors.New("certfile: certificate and key paths are required")
	}
	return NewSource(cfg, certPath+"~"+keyPath, "pair", []string{certPath, keyPath}, func(now time.Time) (*Pair, error) {
		return loadPair(cfg.Open, certPath, keyPath, now)
	})
}

// NewBundleSource watches a root bundle file.
func NewBundleSource(cfg SourceConfig, path string) (*Source[*pki.Bundle], error) {
	if path == "" {
		return nil, errors.New("certfile: root bundle path is required")
	}
	return NewSource(cfg, path, "bundle", []string{path}, func(time.Time) (*pki.Bundle, error) {
		return loadBundle(cfg.Open, path)
	})
}

// SystemRoots is the root bundle path that names the system trust bundle
// (compared without regard to case: CA_ROOT_CA=SYSTEM, file-root:system). A
// file of that name is named "./system".
const SystemRoots = "system"

// IsSystemRoots reports whether path names the system trust bundle.
func IsSystemRoots(path string) bool { return strings.EqualFold(path, SystemRoots) }

// NewRootSource watches the root bundle at path: a PEM file
// (NewBundleSource), or the system roots when IsSystemRoots(path)
// (NewSystemBundleSource). It is how every root bundle setting and resource
// is read.
func NewRootSource(cfg SourceConfig, path string) (*Source[*pki.Bundle], error) {
	if IsSystemRoots(path) {
		return NewSystemBundleSource(cfg)
	}
	return NewBundleSource(cfg, path)
}

// LoadRootSource is NewRootSource followed by a first load, whose error it
// returns: for callers that refuse a root bundle that cannot be read now.
func LoadRootSource(cfg SourceConfig, path string) (*Source[*pki.Bundle], error) {
	src, err := NewRootSource(cfg, path)
	if err != nil {
		return nil, err
	}
	if _, err := src.Reload(); err != nil {
		return nil, err
	}
	return src, nil
}

// NewSystemBundleSource watches the system root bundle (SystemBundlePath).
func NewSystemBundleSource(cfg SourceConfig) (*Source[*pki.Bundle], error) {
	path, err := SystemBundlePath()
	if err != nil {
		return nil, err
	}
	return NewSource(cfg, "system:"+path, "system_bundle", []string{path}, func(time.Time) (*pki.Bundle, error) {
		return LoadSystemBundle(path)
	})
}

// Name returns the source's name as used in logs.
func (s *Source[T]) Name() string { return s.name }

// Current returns the last good value (ok is false before the first good
// load) and a channel that is closed when a newer value replaces it. Any
// number of goroutines may wait on the channel.
func (s *Source[T]) Current() (v T, ok bool, changed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.ok, s.changed
}

// Wait returns the current value, waiting for the first good load if there
// is none yet, or ctx's error.
func (s *Source[T]) Wait(ctx context.Context) (T, error) {
	for {
		v, ok, changed := s.Current()
		if ok {
			return v, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			var zero T
			return zero, fmt.Errorf("waiting for %s: %w", s.name, ctx.Err())
		}
	}
}

// Reload loads the files now. It publishes the result if it is good and
// differs from the held value, and reports whether it did. On error the held
// value stays; the error is logged and counted as well as returned.
func (s *Source[T]) Reload() (bool, error) {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	v, err := s.load(s.clock.Now())
	if err != nil {
		reason := Reason(err)
		s.metrics.failures.WithLabelValues(s.kind, reason).Inc()
		s.log.Warn("files rejected, keeping the last good value", zap.String(logkeys.Reason, reason), zap.Error(err))
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ok && s.cur.Equal(v) {
		return false, nil
	}
	s.cur, s.ok = v, true
	close(s.changed)
	s.changed = make(chan struct{})
	s.metrics.updates.WithLabelValues(s.kind).Inc()
	fields := []zap.Field{}
	if p, isPair := any(v).(*Pair); isPair {
		fields = append(fields, zap.Time(logkeys.NotAfter, p.Leaf().NotAfter))
	}
	s.log.Info("files loaded", fields...)
	return true, nil
}

// Run watches the files and re-loads them after every change until ctx
// ends, and returns nil. It loads once at start, after the watches are in
// place. Files in a directory that cannot be watched are re-read
// periodically instead (see filewatch); nothing found on disk stops it. It
// may be called once.
func (s *Source[T]) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return fmt.Errorf("certfile %s: Run called more than once", s.name)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = s.watcher.Run(ctx) }) // returns nil when ctx ends; Run is called once
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.watcher.Changes():
			_, _ = s.Reload() // logged and counted by Reload
		}
	}
}

// Follow calls fn with the current value, when there is one, and again with
// every newer value, until ctx ends. Values published while fn runs merge:
// fn then sees the newest. fn runs on the caller's goroutine.
func (s *Source[T]) Follow(ctx context.Context, fn func(T)) {
	for {
		v, ok, changed := s.Current()
		if ok {
			fn(v)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

package filewatch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
)

// countingOpen opens real fsnotify watchers and counts them.
func countingOpen(n *atomic.Int32) func() (backend, error) {
	return func() (backend, error) {
		n.Add(1)
		return openFSNotify()
	}
}

// denyingBackend is a real fsnotify watcher that refuses to watch some
// directories, as the kernel does for a directory the process may not read
// or once the user's watch limit is reached.
type denyingBackend struct {
	backend
	deny map[string]error
}

func (b denyingBackend) Add(dir string) error {
	if err, ok := b.deny[dir]; ok {
		return err
	}
	return b.backend.Add(dir)
}

// startWatcher runs a watcher of path on h until the test ends and
// consumes its first signal.
func startWatcher(t *testing.T, cfg Config) *Watcher {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	return w
}

// Many Watchers, each of its own directory, share one fsnotify watcher;
// it is closed (with its goroutine, which goleak checks) once the last
// Watcher stops.
func TestOneInstanceForManyWatchers(t *testing.T) {
	var opens atomic.Int32
	h := newHub(countingOpen(&opens))
	const n = 40
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ws []*Watcher
	for i := range n {
		dir := t.TempDir()
		p := filepath.Join(dir, "root.pem")
		writeFile(t, p, fmt.Sprint(i))
		w, err := New(Config{Paths: []string{p}, Debounce: 10 * time.Millisecond, hub: h})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
		wg.Go(func() {
			if err := w.Run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	for _, w := range ws {
		expectSignal(t, w, 5*time.Second)
	}
	if got := opens.Load(); got != 1 {
		t.Errorf("%d fsnotify watchers opened for %d Watchers, want 1", got, n)
	}
	if dirs, open := stats(h); dirs != n || !open {
		t.Errorf("hub watches %d directories (open %v), want %d", dirs, open, n)
	}
	// Each still sees its own changes.
	writeFile(t, ws[7].Paths()[0], "changed")
	expectSignal(t, ws[7], 5*time.Second)
	cancel()
	wg.Wait()
	if dirs, open := stats(h); dirs != 0 || open {
		t.Errorf("after every Watcher stopped: %d directories, open %v", dirs, open)
	}
}

// Two Watchers of files in one directory share its watch; the directory
// stays watched until the second one stops.
func TestSharedDirectoryIsReferenceCounted(t *testing.T) {
	h := newHub(openFSNotify)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.pem"), filepath.Join(dir, "b.pem")
	writeFile(t, a, "a")
	writeFile(t, b, "b")
	ctxA, cancelA := context.WithCancel(context.Background())
	wa, err := New(Config{Paths: []string{a}, Debounce: 10 * time.Millisecond, hub: h})
	if err != nil {
		t.Fatal(err)
	}
	doneA := make(chan error, 1)
	go func() { doneA <- wa.Run(ctxA) }()
	expectSignal(t, wa, 5*time.Second)
	wb := startWatcher(t, Config{Paths: []string{b}, Debounce: 10 * time.Millisecond, hub: h})
	if dirs, _ := stats(h); dirs != 1 {
		t.Fatalf("%d directories watched for two files of one directory", dirs)
	}
	cancelA()
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	if dirs, open := stats(h); dirs != 1 || !open {
		t.Fatalf("after one of two stopped: %d directories, open %v", dirs, open)
	}
	writeFile(t, b, "b2")
	expectSignal(t, wb, 5*time.Second)
}

// A directory that cannot be watched does not stop the Watcher: its files
// are re-read every poll interval, the failure is counted, and a Watcher of
// another directory keeps being driven by events.
func TestUnwatchableDirectoryIsPolled(t *testing.T) {
	denied, ok := t.TempDir(), t.TempDir()
	deny := map[string]error{existingDir(denied): fmt.Errorf("inotify_add_watch: %w", syscall.EACCES)}
	h := newHub(func() (backend, error) {
		be, err := openFSNotify()
		if err != nil {
			return nil, err
		}
		return denyingBackend{be, deny}, nil
	})
	reg := prometheus.NewRegistry()
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	const poll = 3 * time.Second
	pd := filepath.Join(denied, "root.pem")
	writeFile(t, pd, "v0")
	wd := startWatcher(t, Config{Paths: []string{pd}, Debounce: 10 * time.Millisecond, PollInterval: poll, Clock: clk, Registerer: reg, hub: h})
	po := filepath.Join(ok, "root.pem")
	writeFile(t, po, "v0")
	wo := startWatcher(t, Config{Paths: []string{po}, Debounce: 10 * time.Millisecond, Registerer: reg, hub: h})

	if got := testutil.ToFloat64(newMetricsFrom(t, reg).failures.WithLabelValues("permission")); got != 1 {
		t.Errorf("permission failures counted: %v, want 1", got)
	}
	if got := testutil.ToFloat64(newMetricsFrom(t, reg).polling); got != 1 {
		t.Errorf("polling watchers: %v, want 1", got)
	}

	for i := 1; i <= 3; i++ {
		writeFile(t, pd, fmt.Sprint("v", i))
		testwait.Timer(t, clk)
		clk.Step(poll)
		expectSignal(t, wd, 5*time.Second)
	}
	// An unchanged file polled again is no change.
	testwait.Timer(t, clk)
	clk.Step(poll)
	expectQuiet(t, wd)

	writeFile(t, po, "v1")
	expectSignal(t, wo, 5*time.Second)
}

// newMetricsFrom returns the watcher metrics registered in reg.
func newMetricsFrom(t *testing.T, reg *prometheus.Registry) *metrics {
	t.Helper()
	return newMetrics(reg)
}

// With no inotify instance to be had (the user's max_user_instances
// reached), every Watcher polls; once an instance can be opened again, the
// next poll watches the directory and events drive the Watcher again.
func TestNoInstanceFallsBackToPolling(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	h := newHub(func() (backend, error) {
		if refuse.Load() {
			return nil, fmt.Errorf("inotify_init1: %w", syscall.EMFILE)
		}
		return openFSNotify()
	})
	reg := prometheus.NewRegistry()
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	dir := t.TempDir()
	p := filepath.Join(dir, "root.pem")
	writeFile(t, p, "v0")
	w := startWatcher(t, Config{Paths: []string{p}, Debounce: 50 * time.Millisecond, Clock: clk, Registerer: reg, hub: h})
	m := newMetricsFrom(t, reg)
	if got := testutil.ToFloat64(m.failures.WithLabelValues("no_instance")); got != 1 {
		t.Errorf("no_instance failures: %v, want 1", got)
	}
	writeFile(t, p, "v1")
	testwait.Timer(t, clk)
	clk.Step(DefaultPollInterval)
	expectSignal(t, w, 5*time.Second)
	if _, open := stats(h); open {
		t.Fatal("the hub holds an instance it could not open")
	}

	refuse.Store(false)
	testwait.Timer(t, clk)
	clk.Step(DefaultPollInterval) // watches again; nothing changed
	expectQuiet(t, w)
	if dirs, open := stats(h); dirs != 1 || !open {
		t.Fatalf("after instances are available again: %d directories, open %v", dirs, open)
	}
	if got := testutil.ToFloat64(m.polling); got != 0 {
		t.Errorf("polling watchers: %v, want 0", got)
	}
	writeFile(t, p, "v2")
	testwait.Timer(t, clk) // the debounce timer, armed by an event
	clk.Step(50 * time.Millisecond)
	expectSignal(t, w, 5*time.Second)
}

// A watched directory deleted and made again (rm -rf certs; mkdir certs;
// cp ...), faster than the debounce: the new content is signalled, and so
// is every later change.
func TestDirectoryDeletedAndMadeAgain(t *testing.T) {
	const debounce = 100 * time.Millisecond
	base := t.TempDir()
	dir := filepath.Join(base, "certs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "root.pem")
	writeFile(t, p, "v0")
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	w := startWatcher(t, Config{Paths: []string{p}, Debounce: debounce, Clock: clk})

	for round := 1; round <= 3; round++ {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, p, fmt.Sprint("v", round))
		stepUntilSignal(t, w, clk, debounce, 5*time.Second)

		// A later plain change in the new directory.
		writeFile(t, p, fmt.Sprint("v", round, "b"))
		stepUntilSignal(t, w, clk, debounce, 5*time.Second)
	}
}

// stats returns how many directories h watches and whether its fsnotify
// watcher is open.
func stats(h *hub) (dirs int, open bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.dirs), h.be != nil
}

package filewatch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Many Watchers, each of its own directory, share one instance; it is
// closed (with its goroutine, which the bubble waits for) once the last
// Watcher stops.
func TestOneInstanceForManyWatchers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const debounce = 10 * time.Millisecond
		k := newFakeInotify(t)
		h := newHub(k.open)
		const n = 40
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var ws []*Watcher
		for i := range n {
			dir := t.TempDir()
			p := filepath.Join(dir, "root.pem")
			writeFile(t, p, fmt.Sprint(i))
			w, err := New(Config{Paths: []string{p}, Debounce: debounce, hub: h})
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
		for i, w := range ws {
			if !signalled(w) {
				t.Fatalf("Watcher %d sent no signal once it was watching", i)
			}
		}
		if got := k.openCount(); got != 1 {
			t.Errorf("%d instances opened for %d Watchers, want 1", got, n)
		}
		if dirs, open := stats(h); dirs != n || !open || len(k.watchedDirs()) != n {
			t.Errorf("hub watches %d directories (open %v), the instance %d; want %d", dirs, open, len(k.watchedDirs()), n)
		}
		// Each sees its own changes, and only those.
		k.write(ws[7].Paths()[0], "changed")
		time.Sleep(debounce)
		for i, w := range ws {
			if got := signalled(w); got != (i == 7) {
				t.Errorf("Watcher %d signalled %v after a change of Watcher 7's file", i, got)
			}
		}
		cancel()
		wg.Wait()
		if dirs, open := stats(h); dirs != 0 || open || k.instance() != nil {
			t.Errorf("after every Watcher stopped: %d directories, open %v", dirs, open)
		}
	})
}

// Two Watchers of files in one directory share its watch; the directory
// stays watched until the second one stops.
func TestSharedDirectoryIsReferenceCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const debounce = 10 * time.Millisecond
		k := newFakeInotify(t)
		h := newHub(k.open)
		dir := t.TempDir()
		a, b := filepath.Join(dir, "a.pem"), filepath.Join(dir, "b.pem")
		writeFile(t, a, "a")
		writeFile(t, b, "b")
		ctxA, cancelA := context.WithCancel(context.Background())
		wa, err := New(Config{Paths: []string{a}, Debounce: debounce, hub: h})
		if err != nil {
			t.Fatal(err)
		}
		doneA := make(chan error, 1)
		go func() { doneA <- wa.Run(ctxA) }()
		if !signalled(wa) {
			t.Fatal("the first Watcher sent no signal once it was watching")
		}
		wb, err := New(Config{Paths: []string{b}, Debounce: debounce, hub: h})
		if err != nil {
			t.Fatal(err)
		}
		start(t, wb)
		if dirs, _ := stats(h); dirs != 1 {
			t.Fatalf("%d directories watched for two files of one directory", dirs)
		}
		cancelA()
		if err := <-doneA; err != nil {
			t.Fatal(err)
		}
		if dirs, open := stats(h); dirs != 1 || !open || !slices.Equal(k.watchedDirs(), []string{existingDir(dir)}) {
			t.Fatalf("after one of two stopped: %d directories, open %v, the instance watches %v", dirs, open, k.watchedDirs())
		}
		k.write(b, "b2")
		signalsAfter(t, wb, debounce, "a change of the second file")
	})
}

// A directory that cannot be watched does not stop the Watcher: its files
// are re-read every poll interval, the failure is counted, and a Watcher of
// another directory keeps being driven by events.
func TestUnwatchableDirectoryIsPolled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			debounce = 10 * time.Millisecond
			poll     = 3 * time.Second
		)
		k := newFakeInotify(t)
		h := newHub(k.open)
		denied, ok := t.TempDir(), t.TempDir()
		k.deny[existingDir(denied)] = fmt.Errorf("inotify_add_watch: %w", syscall.EACCES)
		reg := prometheus.NewRegistry()
		pd := filepath.Join(denied, "root.pem")
		writeFile(t, pd, "v0")
		wd, err := New(Config{Paths: []string{pd}, Debounce: debounce, PollInterval: poll, Registerer: reg, hub: h})
		if err != nil {
			t.Fatal(err)
		}
		start(t, wd)
		po := filepath.Join(ok, "root.pem")
		writeFile(t, po, "v0")
		wo, err := New(Config{Paths: []string{po}, Debounce: debounce, Registerer: reg, hub: h})
		if err != nil {
			t.Fatal(err)
		}
		start(t, wo)

		m := newMetrics(reg)
		if got := testutil.ToFloat64(m.failures.WithLabelValues("permission")); got != 1 {
			t.Errorf("permission failures counted: %v, want 1", got)
		}
		if got := testutil.ToFloat64(m.polling); got != 1 {
			t.Errorf("polling watchers: %v, want 1", got)
		}

		for i := 1; i <= 3; i++ {
			k.write(pd, fmt.Sprint("v", i)) // reaches no watch
			signalsAfter(t, wd, poll, fmt.Sprint("change ", i))
		}
		// An unchanged file polled again is no change.
		time.Sleep(poll)
		if signalled(wd) {
			t.Fatal("an unchanged file was signalled at a poll")
		}

		k.write(po, "v1")
		signalsAfter(t, wo, debounce, "a change in the watchable directory")
		if signalled(wd) {
			t.Fatal("the polling Watcher signalled a change of another directory")
		}
	})
}

// With no instance to be had (the user's max_user_instances reached), every
// Watcher polls; once an instance can be opened again, the next poll
// watches the directory and events drive the Watcher again.
func TestNoInstanceFallsBackToPolling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const debounce = 50 * time.Millisecond
		k := newFakeInotify(t)
		k.setRefuse(fmt.Errorf("inotify_init1: %w", syscall.EMFILE))
		h := newHub(k.open)
		reg := prometheus.NewRegistry()
		p := filepath.Join(t.TempDir(), "root.pem")
		writeFile(t, p, "v0")
		w, err := New(Config{Paths: []string{p}, Debounce: debounce, Registerer: reg, hub: h})
		if err != nil {
			t.Fatal(err)
		}
		start(t, w)
		m := newMetrics(reg)
		if got := testutil.ToFloat64(m.failures.WithLabelValues("no_instance")); got != 1 {
			t.Errorf("no_instance failures: %v, want 1", got)
		}
		k.write(p, "v1")
		signalsAfter(t, w, DefaultPollInterval, "a change while polling")
		if _, open := stats(h); open {
			t.Fatal("the hub holds an instance it could not open")
		}

		k.setRefuse(nil)
		time.Sleep(DefaultPollInterval) // watches again; nothing changed
		if signalled(w) {
			t.Fatal("signalled at the poll that watched again, with nothing changed")
		}
		if dirs, open := stats(h); dirs != 1 || !open || len(k.watchedDirs()) != 1 {
			t.Fatalf("after instances are available again: %d directories, open %v, the instance watches %v", dirs, open, k.watchedDirs())
		}
		if got := testutil.ToFloat64(m.polling); got != 0 {
			t.Errorf("polling watchers: %v, want 0", got)
		}
		k.write(p, "v2")
		signalsAfter(t, w, debounce, "a change once watched again")
	})
}

// A watched directory deleted and made again (rm -rf certs; mkdir certs;
// cp ...), within one debounce period: the new content is signalled, and so
// is every later change, which only a new watch of the new directory sees.
func TestDirectoryDeletedAndMadeAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const debounce = 100 * time.Millisecond
		k := newFakeInotify(t)
		dir := filepath.Join(t.TempDir(), "certs")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "root.pem")
		writeFile(t, p, "v0")
		w := newWatcher(t, k, Config{Paths: []string{p}, Debounce: debounce})
		start(t, w)

		for round := 1; round <= 3; round++ {
			k.removeAll(dir)
			k.mkdirAll(dir)
			k.write(p, fmt.Sprint("v", round))
			signalsAfter(t, w, debounce, fmt.Sprint("round ", round))

			// A later plain change in the new directory.
			k.write(p, fmt.Sprint("v", round, "b"))
			signalsAfter(t, w, debounce, fmt.Sprint("a change after round ", round))
		}
	})
}

// stats returns how many directories h watches and whether its instance is
// open.
func stats(h *hub) (dirs int, open bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.dirs), h.be != nil
}

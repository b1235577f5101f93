package filewatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meshagent/meshagent/internal/testwait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Most tests run in a synctest bubble: the debounce and poll timers run on
// the bubble's clock, and a fakeInotify delivers the events of the changes
// the test makes to real files. TestRealInotify checks the same wiring with
// the kernel's inotify and the process's shared watcher.

// scenario sets up a watched file and then changes it the way one kind of
// writer does.
type scenario struct {
	name string
	// setup creates the initial state in dir and returns the path to watch.
	setup func(t *testing.T, dir string) string
	// change modifies the watched file (or its surroundings) to hold
	// fmt.Sprint("v", n).
	change func(fs fsOps, dir, path string, n int)
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	realFS{t}.write(p, content)
}

func plainFile(t *testing.T, dir string) string {
	p := filepath.Join(dir, "cert.pem")
	writeFile(t, p, "v0")
	return p
}

// k8sVolume lays out dir like a Kubernetes Secret volume:
// cert.pem -> ..data/cert.pem, ..data -> ..<timestamp>/.
func k8sVolume(t *testing.T, dir string) string {
	k8sSwap(realFS{t}, dir, "v0", 0)
	realFS{t}.symlink(filepath.Join("..data", "cert.pem"), filepath.Join(dir, "cert.pem"))
	return filepath.Join(dir, "cert.pem")
}

// k8sSwap writes a new timestamped directory and atomically points ..data at
// it, then removes the previous one, as the kubelet's atomic writer does.
func k8sSwap(fs fsOps, dir, content string, n int) {
	ts := fmt.Sprintf("..2026_11_21_10_00_%02d.%d", n, 1000+n)
	fs.mkdirAll(filepath.Join(dir, ts))
	fs.write(filepath.Join(dir, ts, "cert.pem"), content)
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	fs.symlink(ts, tmp)
	fs.rename(tmp, filepath.Join(dir, "..data"))
	if old != "" {
		fs.removeAll(filepath.Join(dir, old))
	}
}

// atomicRename writes the new content beside p and renames it over p.
func atomicRename(fs fsOps, dir, p string, n int) {
	tmp := filepath.Join(dir, ".cert.pem.tmp")
	fs.write(tmp, fmt.Sprint("v", n))
	fs.rename(tmp, p)
}

func scenarios() []scenario {
	return []scenario{
		{
			name:  "plain write",
			setup: plainFile,
			change: func(fs fsOps, _, p string, n int) {
				fs.write(p, fmt.Sprint("v", n))
			},
		},
		{
			name:   "atomic rename over the file",
			setup:  plainFile,
			change: atomicRename,
		},
		{
			// vim with backupcopy=no: move the original aside, write a new
			// file, delete the backup.
			name:  "editor backup and rewrite",
			setup: plainFile,
			change: func(fs fsOps, _, p string, n int) {
				fs.rename(p, p+"~")
				fs.write(p, fmt.Sprint("v", n))
				fs.remove(p + "~")
			},
		},
		{
			name:  "delete and re-create",
			setup: plainFile,
			change: func(fs fsOps, _, p string, n int) {
				fs.remove(p)
				fs.write(p, fmt.Sprint("v", n))
			},
		},
		{
			name:  "kubernetes ..data swap",
			setup: k8sVolume,
			change: func(fs fsOps, dir, _ string, n int) {
				k8sSwap(fs, dir, fmt.Sprint("v", n), n)
			},
		},
		{
			name: "file appears in a directory created later",
			setup: func(t *testing.T, dir string) string {
				return filepath.Join(dir, "later", "deeper", "cert.pem")
			},
			change: func(fs fsOps, _, p string, n int) {
				fs.mkdirAll(filepath.Dir(p))
				fs.write(p, fmt.Sprint("v", n))
			},
		},
	}
}

// newWatcher makes a Watcher of cfg on a hub of k (in a bubble).
func newWatcher(t *testing.T, k *fakeInotify, cfg Config) *Watcher {
	t.Helper()
	cfg.hub = newHub(k.open)
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// start runs w until the test ends, failing the test if Run returned an
// error, and takes the signal Run sends once it is watching. In a bubble.
func start(t *testing.T, w *Watcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	if !signalled(w) {
		t.Fatal("Run sent no signal once it was watching")
	}
}

// signalled reports whether w has signalled, once everything in the bubble
// has done what it can at the bubble's present time; it takes the signal.
func signalled(w *Watcher) bool {
	synctest.Wait()
	select {
	case <-w.Changes():
		return true
	default:
		return false
	}
}

// signalsAfter checks that w signals d after now, not a nanosecond sooner.
func signalsAfter(t *testing.T, w *Watcher, d time.Duration, what string) {
	t.Helper()
	time.Sleep(d - time.Nanosecond)
	if signalled(w) {
		t.Fatalf("%s: signalled before %s", what, d)
	}
	time.Sleep(time.Nanosecond)
	if !signalled(w) {
		t.Fatalf("%s: no signal %s after it", what, d)
	}
}

// Each kind of change is signalled once the directory has been quiet for
// the debounce period, not a nanosecond before, and then the file holds the
// new content; repeated changes keep being seen (the watch set follows
// symlink swaps and re-created files and directories).
func TestChangeSignalledAfterDebounce(t *testing.T) {
	const debounce = 100 * time.Millisecond
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k := newFakeInotify(t)
				dir := t.TempDir()
				p := sc.setup(t, dir)
				w := newWatcher(t, k, Config{Paths: []string{p}, Debounce: debounce})
				start(t, w)
				for n := 1; n <= 3; n++ {
					sc.change(k, dir, p, n)
					signalsAfter(t, w, debounce, fmt.Sprint("change ", n))
					got, err := os.ReadFile(p)
					if err != nil || string(got) != fmt.Sprint("v", n) {
						t.Fatalf("after change %d the file reads %q, %v", n, got, err)
					}
				}
			})
		})
	}
}

// The kernel's inotify and the process's shared watcher, on real files with
// the real clock: a change is signalled, and the consumer then reads the new
// content. Each of these changes replaces the content in one step (a rename),
// so it makes exactly one signal however slowly its steps run, and a signal
// taken for change n cannot be left over from change n-1.
func TestRealInotify(t *testing.T) {
	for _, sc := range scenarios() {
		if sc.name != "atomic rename over the file" && sc.name != "kubernetes ..data swap" {
			continue
		}
		t.Run(sc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := sc.setup(t, dir)
			w, err := New(Config{Paths: []string{p}, Debounce: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
				if dirs, open := stats(processHub); dirs != 0 || open {
					t.Errorf("after Run returned the process's watcher holds %d directories (open %v)", dirs, open)
				}
			}()
			awaitSignal(t, w, "the signal of Run's start")
			if dirs, open := stats(processHub); dirs == 0 || !open {
				t.Fatalf("the process's watcher holds %d directories (open %v)", dirs, open)
			}
			for n := 1; n <= 3; n++ {
				sc.change(realFS{t}, dir, p, n)
				awaitSignal(t, w, fmt.Sprint("change ", n))
				got, err := os.ReadFile(p)
				if err != nil || string(got) != fmt.Sprint("v", n) {
					t.Fatalf("after the signal of change %d the file reads %q, %v", n, got, err)
				}
			}
		})
	}
}

// awaitSignal waits in real time for a signal of w, failing after
// testwait.Timeout: a bound on a loaded machine, not a latency figure.
func awaitSignal(t *testing.T, w *Watcher, what string) {
	t.Helper()
	select {
	case <-w.Changes():
	case <-time.After(testwait.Timeout):
		t.Fatalf("%s: no signal within %s", what, testwait.Timeout)
	}
}

// Events that leave the content as it was cost a re-read but no signal.
func TestNoSignalWithoutContentChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const debounce = 100 * time.Millisecond
		k := newFakeInotify(t)
		dir := t.TempDir()
		p := plainFile(t, dir)
		core, logs := observer.New(zapcore.DebugLevel)
		w := newWatcher(t, k, Config{Paths: []string{p}, Debounce: debounce, Logger: zap.New(core)})
		start(t, w)
		events := func() int { return logs.FilterMessage("file system event").Len() }
		quiet := func(what string) {
			t.Helper()
			time.Sleep(debounce)
			if signalled(w) {
				t.Fatalf("%s: signalled", what)
			}
			if events() == 0 {
				t.Fatalf("%s: no event reached the watcher", what)
			}
			logs.TakeAll()
		}

		k.write(filepath.Join(dir, "other.pem"), "x")
		k.remove(filepath.Join(dir, "other.pem"))
		quiet("unrelated files in the same directory")

		k.write(p, "v0")
		k.touch(p)
		quiet("the same content written again, and a touch")

		k.write(p, "v1")
		k.write(p, "v0")
		quiet("replaced and restored within the debounce period")

		k.write(p, "v1")
		signalsAfter(t, w, debounce, "a change after all that")
	})
}

func TestDeletionIsSignalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const debounce = 20 * time.Millisecond
		k := newFakeInotify(t)
		p := plainFile(t, t.TempDir())
		w := newWatcher(t, k, Config{Paths: []string{p}, Debounce: debounce})
		start(t, w)
		k.remove(p)
		signalsAfter(t, w, debounce, "deletion")
		k.write(p, "v0")
		signalsAfter(t, w, debounce, "re-creation with the old content")
	})
}

// A Watcher of several files signals a change of any of them, and of none
// other; a path given twice is watched once.
func TestSeveralFiles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const debounce = 20 * time.Millisecond
		k := newFakeInotify(t)
		dirA, dirB := t.TempDir(), t.TempDir()
		a, b := plainFile(t, dirA), plainFile(t, dirB)
		w := newWatcher(t, k, Config{Paths: []string{a, b, a}, Debounce: debounce})
		if got := len(w.Paths()); got != 2 {
			t.Fatalf("duplicate path kept: %d paths", got)
		}
		start(t, w)
		k.write(b, "changed")
		signalsAfter(t, w, debounce, "a change of the second file")
		k.write(a, "changed")
		signalsAfter(t, w, debounce, "a change of the first file")
		k.write(filepath.Join(dirA, "other"), "x")
		time.Sleep(debounce)
		if signalled(w) {
			t.Fatal("an unwatched file of a watched directory was signalled")
		}
	})
}

// A stream of events that never goes quiet is cut off after ten debounce
// periods, so a busy directory cannot postpone a change for ever.
func TestBurstIsCutOff(t *testing.T) {
	const debounce = 100 * time.Millisecond
	w, err := New(Config{Paths: []string{"f"}, Debounce: debounce})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Unix(1_800_000_000, 0)
	tests := []struct {
		sinceStart, want time.Duration
	}{
		{0, debounce},
		{500 * time.Millisecond, debounce},
		{900 * time.Millisecond, debounce},
		{950 * time.Millisecond, 50 * time.Millisecond},
		{time.Second, 0},
		{5 * time.Second, 0},
	}
	for _, tt := range tests {
		if got := w.wait(start, start.Add(tt.sinceStart)); got != tt.want {
			t.Errorf("event %s into a burst: wait %s, want %s", tt.sinceStart, got, tt.want)
		}
	}
}

// End to end: a directory kept busy, an event every half debounce period,
// still yields the signal, exactly ten debounce periods after the change.
func TestBurstIsCutOffInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const debounce = 100 * time.Millisecond
		k := newFakeInotify(t)
		dir := t.TempDir()
		p := plainFile(t, dir)
		w := newWatcher(t, k, Config{Paths: []string{p}, Debounce: debounce})
		start(t, w)
		changed := time.Now()
		k.write(p, "v1")
		for i := 0; ; i++ {
			time.Sleep(debounce / 2)
			if signalled(w) {
				break
			}
			if time.Since(changed) > maxDelayFactor*debounce {
				t.Fatal("a continuous stream of events postponed the signal past the cut-off")
			}
			k.write(filepath.Join(dir, "noise"), fmt.Sprint(i))
		}
		if got, want := time.Since(changed), maxDelayFactor*debounce; got != want {
			t.Fatalf("signalled %s after the change, want %s", got, want)
		}
	})
}

// An overflow of the kernel's queue may have lost events: every Watcher
// re-reads, and one whose file changed unseen signals.
func TestOverflowMakesWatchersReread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const debounce = 20 * time.Millisecond
		k := newFakeInotify(t)
		h := newHub(k.open)
		var ws []*Watcher
		for range 2 {
			w, err := New(Config{Paths: []string{plainFile(t, t.TempDir())}, Debounce: debounce, hub: h})
			if err != nil {
				t.Fatal(err)
			}
			start(t, w)
			ws = append(ws, w)
		}
		writeFile(t, ws[0].Paths()[0], "v1") // no event: lost
		time.Sleep(debounce)
		if signalled(ws[0]) {
			t.Fatal("a change without an event was signalled before the overflow")
		}
		k.overflow()
		signalsAfter(t, ws[0], debounce, "the overflow")
		if signalled(ws[1]) {
			t.Fatal("the Watcher whose file did not change signalled")
		}
	})
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no paths", Config{Debounce: time.Second}},
		{"empty path", Config{Paths: []string{""}, Debounce: time.Second}},
		{"negative debounce", Config{Paths: []string{"x"}, Debounce: -time.Second}},
		{"no debounce", Config{Paths: []string{"x"}}},
		{"negative poll interval", Config{Paths: []string{"x"}, Debounce: time.Second, PollInterval: -time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil {
				t.Fatal("New accepted a bad config")
			}
		})
	}
}

func TestRunTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newFakeInotify(t)
		w := newWatcher(t, k, Config{Paths: []string{filepath.Join(t.TempDir(), "f")}, Debounce: time.Millisecond})
		start(t, w)
		if err := w.Run(context.Background()); !errors.Is(err, ErrRunTwice) {
			t.Fatalf("second Run: %v, want ErrRunTwice", err)
		}
	})
}

func TestRelativePathIsAbsolute(t *testing.T) {
	w, err := New(Config{Paths: []string{"etc/certs/cert-chain.pem"}, Debounce: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	if got, want := w.Paths()[0], filepath.Join(wd, "etc/certs/cert-chain.pem"); got != want {
		t.Fatalf("path %s, want %s", got, want)
	}
}

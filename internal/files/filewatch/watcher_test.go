package filewatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/testwait"
	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// scenario sets up a watched file and then changes it the way one kind of
// writer does.
type scenario struct {
	name string
	// setup creates the initial state in dir and returns the path to watch.
	setup func(t *testing.T, dir string) string
	// change modifies the watched file (or its surroundings).
	change func(t *testing.T, dir, path string, n int)
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func plainFile(t *testing.T, dir string) string {
	p := filepath.Join(dir, "cert.pem")
	writeFile(t, p, "v0")
	return p
}

// k8sVolume lays out dir like a Kubernetes Secret volume:
// cert.pem -> ..data/cert.pem, ..data -> ..<timestamp>/.
func k8sVolume(t *testing.T, dir string) string {
	k8sSwap(t, dir, "v0", 0)
	if err := os.Symlink(filepath.Join("..data", "cert.pem"), filepath.Join(dir, "cert.pem")); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "cert.pem")
}

// k8sSwap writes a new timestamped directory and atomically points ..data at
// it, then removes the previous one, as the kubelet's atomic writer does.
func k8sSwap(t *testing.T, dir, content string, n int) {
	t.Helper()
	ts := fmt.Sprintf("..2026_11_21_10_00_%02d.%d", n, 1000+n)
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, ts, "cert.pem"), content)
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

func scenarios() []scenario {
	return []scenario{
		{
			name:  "plain write",
			setup: plainFile,
			change: func(t *testing.T, _, p string, n int) {
				writeFile(t, p, fmt.Sprintf("v%d", n))
			},
		},
		{
			name:  "atomic rename over the file",
			setup: plainFile,
			change: func(t *testing.T, dir, p string, n int) {
				tmp := filepath.Join(dir, ".cert.pem.tmp")
				writeFile(t, tmp, fmt.Sprintf("v%d", n))
				if err := os.Rename(tmp, p); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			// vim with backupcopy=no: move the original aside, write a new
			// file, delete the backup.
			name:  "editor backup and rewrite",
			setup: plainFile,
			change: func(t *testing.T, _, p string, n int) {
				if err := os.Rename(p, p+"~"); err != nil {
					t.Fatal(err)
				}
				writeFile(t, p, fmt.Sprintf("v%d", n))
				if err := os.Remove(p + "~"); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name:  "delete and re-create",
			setup: plainFile,
			change: func(t *testing.T, _, p string, n int) {
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
				writeFile(t, p, fmt.Sprintf("v%d", n))
			},
		},
		{
			name:  "kubernetes ..data swap",
			setup: k8sVolume,
			change: func(t *testing.T, dir, _ string, n int) {
				k8sSwap(t, dir, fmt.Sprintf("v%d", n), n)
			},
		},
		{
			name: "file appears in a directory created later",
			setup: func(t *testing.T, dir string) string {
				return filepath.Join(dir, "later", "deeper", "cert.pem")
			},
			change: func(t *testing.T, _, p string, n int) {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, p, fmt.Sprintf("v%d", n))
			},
		},
	}
}

// run starts w and stops it at the end of the test, failing the test if Run
// returned an error. It consumes the signal Run sends once it is watching.
func run(t *testing.T, w *Watcher) {
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
	expectSignal(t, w, 5*time.Second)
}

func expectSignal(t *testing.T, w *Watcher, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-w.Changes():
		return time.Since(start)
	case <-time.After(within):
		t.Fatalf("no change signalled within %s", within)
		return 0
	}
}

// stepUntilSignal steps clk by debounce each time the watcher has a timer
// armed until it signals a change, failing after within of real time. An
// event the kernel delivers after a step re-arms the debounce timer (a
// directory deleted and made again sends several), so one step may fire a
// timer that is already replaced.
func stepUntilSignal(t *testing.T, w *Watcher, clk *clocktesting.FakeClock, debounce, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if clk.HasWaiters() {
			clk.Step(debounce)
		}
		select {
		case <-w.Changes():
			return
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no change signalled within %s", within)
		}
	}
}

// expectQuiet waits a bounded real time and fails if a signal arrives.
func expectQuiet(t *testing.T, w *Watcher) {
	t.Helper()
	select {
	case <-w.Changes():
		t.Fatal("unexpected change signal")
	case <-time.After(300 * time.Millisecond):
	}
}

// Each kind of change is signalled once the debounce period has passed on
// the injected clock, and not before; repeated changes keep being seen (the
// watch set follows symlink swaps and re-created files).
func TestChangeSignalledAfterDebounce(t *testing.T) {
	const debounce = 100 * time.Millisecond
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := sc.setup(t, dir)
			clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
			w, err := New(Config{Paths: []string{p}, Debounce: debounce, Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			run(t, w)
			for n := 1; n <= 3; n++ {
				sc.change(t, dir, p, n)
				testwait.Timer(t, clk)
				clk.Step(debounce - time.Millisecond)
				select {
				case <-w.Changes():
					t.Fatalf("change %d signalled before the debounce period ended", n)
				case <-time.After(50 * time.Millisecond):
				}
				// Further events of the same change may re-arm the timer;
				// step until the signal comes.
				stepUntilSignal(t, w, clk, debounce, 5*time.Second)
				got, err := os.ReadFile(p)
				if err != nil || string(got) != fmt.Sprintf("v%d", n) {
					t.Fatalf("after change %d the file reads %q, %v", n, got, err)
				}
			}
		})
	}
}

// Real files, real clock: every kind of change reaches the consumer within
// the debounce period plus one second, as docs/operations.md promises.
func TestChangeLatencyRealClock(t *testing.T) {
	const debounce = 100 * time.Millisecond
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := sc.setup(t, dir)
			w, err := New(Config{Paths: []string{p}, Debounce: debounce})
			if err != nil {
				t.Fatal(err)
			}
			run(t, w)
			var worst time.Duration
			for n := 1; n <= 3; n++ {
				sc.change(t, dir, p, n)
				// Measured from the end of the change; its first events
				// may have started the debounce period earlier.
				worst = max(worst, expectSignal(t, w, debounce+time.Second))
			}
			t.Logf("worst latency %s (debounce %s)", worst, debounce)
		})
	}
}

func TestNoSignalWithoutContentChange(t *testing.T) {
	const debounce = 100 * time.Millisecond
	dir := t.TempDir()
	p := plainFile(t, dir)
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	w, err := New(Config{Paths: []string{p}, Debounce: debounce, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	settle := func() {
		t.Helper()
		testwait.Timer(t, clk)
		clk.Step(debounce)
		expectQuiet(t, w)
	}

	// Unrelated files in the same directory.
	writeFile(t, filepath.Join(dir, "other.pem"), "x")
	if err := os.Remove(filepath.Join(dir, "other.pem")); err != nil {
		t.Fatal(err)
	}
	settle()

	// Same content written again, and a touch.
	writeFile(t, p, "v0")
	now := time.Now()
	if err := os.Chtimes(p, now, now); err != nil {
		t.Fatal(err)
	}
	settle()

	// Replaced and restored before the debounce period ends.
	writeFile(t, p, "v1")
	writeFile(t, p, "v0")
	settle()
}

func TestDeletionIsSignalled(t *testing.T) {
	dir := t.TempDir()
	p := plainFile(t, dir)
	w, err := New(Config{Paths: []string{p}, Debounce: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	expectSignal(t, w, 2*time.Second)
	writeFile(t, p, "v0")
	expectSignal(t, w, 2*time.Second)
}

func TestSeveralFiles(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	a, b := plainFile(t, dirA), plainFile(t, dirB)
	w, err := New(Config{Paths: []string{a, b, a}, Debounce: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(w.Paths()); got != 2 {
		t.Fatalf("duplicate path kept: %d paths", got)
	}
	run(t, w)
	writeFile(t, b, "changed")
	expectSignal(t, w, 2*time.Second)
	writeFile(t, a, "changed")
	expectSignal(t, w, 2*time.Second)
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

	// End to end: a directory kept busy still yields the signal.
	dir := t.TempDir()
	p := plainFile(t, dir)
	clk := clocktesting.NewFakeClock(start)
	w, err = New(Config{Paths: []string{p}, Debounce: debounce, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	writeFile(t, p, "v1")
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatal("a continuous stream of events postponed the signal")
		}
		testwait.Timer(t, clk)
		clk.Step(debounce / 2)
		writeFile(t, filepath.Join(dir, "noise"), fmt.Sprint(i))
		select {
		case <-w.Changes():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no paths", Config{}},
		{"empty path", Config{Paths: []string{""}}},
		{"negative debounce", Config{Paths: []string{"x"}, Debounce: -time.Second}},
		{"no debounce", Config{Paths: []string{"x"}}},
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
	w, err := New(Config{Paths: []string{filepath.Join(t.TempDir(), "f")}, Debounce: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	if err := w.Run(context.Background()); !errors.Is(err, ErrRunTwice) {
		t.Fatalf("second Run: %v, want ErrRunTwice", err)
	}
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

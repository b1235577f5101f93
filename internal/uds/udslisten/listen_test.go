package udslisten

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/internal/testwait"
)

// shortDir is a temporary directory with a path short enough for a socket.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ul")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// serveName answers every connection of lis with name and closes it.
func serveName(lis net.Listener, name string) {
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(name))
			_ = c.Close()
		}
	}()
}

// who connects to path and returns what answered.
func who(t *testing.T, path string) string {
	t.Helper()
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		t.Fatalf("connecting to %s: %v", path, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// impostor binds its own socket at path, as a process that replaced the
// agent's would: under another name, renamed onto the path.
func impostor(t *testing.T, path string) {
	t.Helper()
	tmp := path + ".impostor"
	lis, err := net.Listen("unix", tmp)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	t.Cleanup(func() { _ = lis.Close() })
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	serveName(lis, "impostor")
}

type watched struct {
	lis     *Listener
	clock   *clocktesting.FakeClock
	rebinds chan string
	checks  chan bool
}

func listenWatched(t *testing.T, cfg Config) *watched {
	t.Helper()
	w := &watched{clock: clocktesting.NewFakeClock(time.Now()), rebinds: make(chan string, 10), checks: make(chan bool, 100)}
	cfg.Clock = w.clock
	cfg.afterCheck = func(rebound bool) { w.checks <- rebound }
	cfg.OnRebind = func(reason string) { w.rebinds <- reason }
	lis, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.lis = lis
	serveName(lis, "agent")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lis.Watch(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
		_ = lis.Close()
	})
	return w
}

// tick lets Watch make its next check.
func (w *watched) tick(t *testing.T, d time.Duration) {
	t.Helper()
	testwait.Step(t, w.clock, d)
}

func (w *watched) rebound(t *testing.T) string {
	t.Helper()
	select {
	case r := <-w.rebinds:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the socket was not bound again")
		return ""
	}
}

// quiet fails t if the socket is bound again within a short while.
func (w *watched) quiet(t *testing.T) {
	t.Helper()
	select {
	case r := <-w.rebinds:
		t.Fatalf("bound again (%s) before its time", r)
	case <-time.After(200 * time.Millisecond):
	}
}

// settle lets the check that follows a rebind find the socket in place, so
// that the next loss is answered at once again.
func (w *watched) settle(t *testing.T) {
	t.Helper()
	testwait.Timer(t, w.clock)
	for len(w.checks) > 0 {
		<-w.checks
	}
	w.clock.Step(4 * DefaultCheckInterval)
	select {
	case rebound := <-w.checks:
		if rebound {
			t.Fatal("the check after the rebind bound the socket again")
		}
	case <-time.After(testwait.Timeout):
		t.Fatal("no check after the rebind")
	}
	if w.clock.HasWaiters() {
		t.Fatal("a timer is set after the socket was found in place")
	}
}

// A removed socket, one replaced by another process's, and a removed
// directory are bound again as soon as it happens: the fake clock is not
// moved for them, so no timer can have done it.
func TestRebindsARemovedOrReplacedSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "s", "socket")
	w := listenWatched(t, Config{Path: path})
	if got := who(t, path); got != "agent" {
		t.Fatalf("before: %q", got)
	}
	if w.clock.HasWaiters() {
		t.Fatal("an idle listener has a timer set")
	}

	impostor(t, path)
	if r := w.rebound(t); r != ReasonReplaced {
		t.Fatalf("reason %q, want %q", r, ReasonReplaced)
	}
	if got := who(t, path); got != "agent" {
		t.Fatalf("after the rebind: %q, want the listener", got)
	}
	w.settle(t)

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if r := w.rebound(t); r != ReasonRemoved {
		t.Fatalf("reason %q, want %q", r, ReasonRemoved)
	}
	if got := who(t, path); got != "agent" {
		t.Fatalf("after the rebind: %q, want the listener", got)
	}
	w.settle(t)

	// The whole directory taken away (renamed, then removed: removing a
	// directory that holds a socket is not atomic, and the listener may
	// put one back meanwhile): made again, with the directory mode, and
	// watched again.
	for i := range 2 {
		gone := fmt.Sprintf("%s.gone%d", filepath.Dir(path), i)
		if err := os.Rename(filepath.Dir(path), gone); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(gone); err != nil {
			t.Fatal(err)
		}
		w.rebound(t)
		if got := who(t, path); got != "agent" {
			t.Fatalf("after the directory was removed: %q", got)
		}
		if st, err := os.Stat(filepath.Dir(path)); err != nil || st.Mode().Perm() != DefaultDirMode {
			t.Fatalf("directory made again: %v, %v", st.Mode(), err)
		}
		w.settle(t)
	}
}

// While something keeps taking the path, the listener backs off: the next
// rebind waits for CheckInterval, the one after for twice that.
func TestBacksOffWhileThePathKeepsBeingTaken(t *testing.T) {
	path := filepath.Join(shortDir(t), "socket")
	w := listenWatched(t, Config{Path: path})
	impostor(t, path)
	w.rebound(t)

	impostor(t, path)
	w.quiet(t)
	w.tick(t, DefaultCheckInterval)
	if r := w.rebound(t); r != ReasonReplaced {
		t.Fatalf("reason %q", r)
	}
	impostor(t, path)
	testwait.Timer(t, w.clock)
	w.clock.Step(DefaultCheckInterval)
	w.quiet(t)
	w.clock.Step(DefaultCheckInterval)
	w.rebound(t)
	if got := who(t, path); got != "agent" {
		t.Fatalf("%q, want the listener", got)
	}
}

// A rebind that fails (the socket's directory is now a file) is tried
// again CheckInterval later, and succeeds once the path can be used.
func TestFailedRebindIsRetried(t *testing.T) {
	top := shortDir(t)
	path := filepath.Join(top, "s", "socket")
	w := listenWatched(t, Config{Path: path})
	// Swapped in one step, so that the listener cannot make the directory
	// again in between.
	file := filepath.Join(top, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, file, unix.AT_FDCWD, filepath.Dir(path), unix.RENAME_EXCHANGE); err != nil {
		t.Fatal(err)
	}
	testwait.Timer(t, w.clock) // the retry after the failed bind
	w.quiet(t)
	if err := os.Remove(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	w.clock.Step(DefaultCheckInterval)
	if r := w.rebound(t); r != ReasonRemoved {
		t.Fatalf("reason %q", r)
	}
	if got := who(t, path); got != "agent" {
		t.Fatalf("%q, want the listener", got)
	}
}

func TestStart(t *testing.T) {
	t.Run("impostor, replaced", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "socket")
		impostor(t, path)
		w := listenWatched(t, Config{Path: path, Replace: true})
		if got := who(t, path); got != "agent" {
			t.Fatalf("%q, want the listener", got)
		}
		_ = w
	})
	t.Run("regular file, replaced", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "socket")
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		listenWatched(t, Config{Path: path, Replace: true})
		if got := who(t, path); got != "agent" {
			t.Fatalf("%q, want the listener", got)
		}
	})
	t.Run("live socket, not replaced", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "socket")
		impostor(t, path)
		if _, err := Listen(Config{Path: path}); !errors.Is(err, ErrInUse) {
			t.Fatalf("%v, want ErrInUse", err)
		}
		if got := who(t, path); got != "impostor" {
			t.Fatalf("the live socket was touched: %q", got)
		}
	})
	t.Run("regular file, not replaced", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "socket")
		if err := os.WriteFile(path, []byte("mine"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Listen(Config{Path: path}); !errors.Is(err, ErrNotSocket) {
			t.Fatalf("%v, want ErrNotSocket", err)
		}
		if b, _ := os.ReadFile(path); string(b) != "mine" {
			t.Fatal("the file was replaced")
		}
	})
	t.Run("stale socket, replaced", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "socket")
		lis, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		lis.(*net.UnixListener).SetUnlinkOnClose(false)
		_ = lis.Close()
		listenWatched(t, Config{Path: path})
		if got := who(t, path); got != "agent" {
			t.Fatalf("%q", got)
		}
	})
}

// An existing directory keeps its mode (a sticky /tmp stays sticky); one
// made for the socket gets DirMode; the socket gets SocketMode.
func TestModes(t *testing.T) {
	top := shortDir(t)
	if err := os.Chmod(top, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(top, "a", "b", "socket")
	lis, err := Listen(Config{Path: path, DirMode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	for dir, want := range map[string]os.FileMode{top: 0o777 | os.ModeSticky, filepath.Join(top, "a"): 0o755, filepath.Dir(path): 0o755} {
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode() &^ os.ModeDir; got != want {
			t.Errorf("%s: mode %v, want %v", dir, got, want)
		}
	}
	st, err := os.Lstat(path)
	if err != nil || st.Mode().Perm() != DefaultSocketMode || st.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket: %v, %v", st.Mode(), err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("the directory holds %d entries, want the socket only", len(entries))
	}
}

// Close removes the socket it bound, and leaves one that replaced it.
func TestCloseRemovesOnlyItsOwnSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "socket")
	lis, err := Listen(Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("own socket left behind: %v", err)
	}
	if err := lis.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	lis, err = Listen(Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	impostor(t, path)
	_ = lis.Close()
	if got := who(t, path); got != "impostor" {
		t.Fatalf("Close removed a socket that was not its own: %q", got)
	}
	if _, err := lis.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

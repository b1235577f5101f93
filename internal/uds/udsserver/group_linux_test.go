package udsserver

import (
	"context"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

// Processes of two pods, told apart by uid: the test process connects as
// uid firstUIDOfA and above (one thread at a time, see dialAs) for pod A,
// as itself for pod B.
const (
	firstUIDOfA = 20000
	podA        = "pod-a"
	podB        = "pod-b"
)

// podsByUID is a Resolver that refuses every caller for good and names, as
// a caller.Grouper, the pod of a process by its uid (A from firstUIDOfA,
// else B), as the node's cgroups would.
type podsByUID struct {
	resolve func(ctx context.Context, cred caller.Cred) (caller.Info, error)
}

func (p podsByUID) Resolve(ctx context.Context, cred caller.Cred) (caller.Info, error) {
	if p.resolve != nil {
		return p.resolve(ctx, cred)
	}
	return caller.Info{}, refusal{msg: "the connecting process has exited"}
}

func (podsByUID) Group(cred caller.Cred) (string, bool) { return podOfUID(cred.UID), true }

func podOfUID(uid uint32) string {
	if uid >= firstUIDOfA {
		return podA
	}
	return podB
}

// openSocketDir lets other uids reach the fixture's socket.
func openSocketDir(t *testing.T, socket string) {
	t.Helper()
	testwait.Within(t, 20*time.Second, "the socket", func() bool { _, err := os.Stat(socket); return err == nil })
	for dir := socket; ; {
		dir = dir[:strings.LastIndexByte(dir, '/')]
		if !strings.HasPrefix(dir, os.TempDir()+"/") {
			return
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// dialAs connects to socket as uid: the kernel records the connecting
// thread's effective uid (SO_PEERCRED), so one thread takes uid as its
// effective uid for the connect and gives it back (setresuid on that
// thread only, its real and saved uids staying root's). It is how a pod's
// process that forks children taking fresh uids looks to the agent.
func dialAs(t *testing.T, socket string, uid uint32) (net.Conn, error) {
	t.Helper()
	runtime.LockOSThread()
	const keep = ^uintptr(0)
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
		runtime.UnlockOSThread()
		t.Skipf("cannot take uid %d: %v", uid, e)
	}
	nc, err := net.Dial("unix", socket)
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, 0, keep); e != 0 {
		// The thread stays locked and ends with this goroutine's test.
		t.Fatalf("giving back uid 0: %v", e)
	}
	runtime.UnlockOSThread()
	return nc, err
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("connects as other uids: needs root")
	}
}

// A caller refused for good (its process has exited) gets no gRPC
// transport, whatever uid it connected as: each refusal, here from 40
// fresh uids of one pod, is the server's own answer (the call's status,
// then a GOAWAY, then the connection is closed).
func TestFinalRefusalsHoldNoTransport(t *testing.T) {
	needRoot(t)
	f := start(t, func(c *Config) { c.Resolver = podsByUID{}; c.DirMode = 0o755; c.MaxConnRatePerCaller = 1000 })
	openSocketDir(t, f.socket)
	for i := range 40 {
		nc, err := dialAs(t, f.socket, firstUIDOfA+uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		got := rawRefusalOn(t, nc)
		if !strings.HasPrefix(got, "status:7 ") || !strings.Contains(got, "has exited") || !strings.Contains(got, " goaway:") {
			t.Fatalf("connection %d of a caller refused for good (uid %d): %q, want its call refused, then GOAWAY, no transport", i, firstUIDOfA+i, got)
		}
	}
}

// Refused connections of one pod whose clients say nothing (the parent of
// a process that connected and exited holds them) are waited for no more
// than maxAwaitingPerGroup at once, whatever uids they connected as; the
// others are answered at once, and another pod's refusal still waits for
// its client's call.
func TestRefusalsWaitingPerPod(t *testing.T) {
	needRoot(t)
	f := start(t, func(c *Config) { c.Resolver = podsByUID{}; c.DirMode = 0o755 })
	f.srv.refusalWait.Store(int64(time.Hour)) // the waiting ones wait until the test ends
	openSocketDir(t, f.socket)
	var (
		silent  []net.Conn
		closed  atomic.Int64
		readers sync.WaitGroup
	)
	defer func() {
		for _, nc := range silent {
			_ = nc.Close()
		}
		readers.Wait()
	}()
	const n = 3 * maxAwaitingPerGroup
	for i := range n {
		nc, err := dialAs(t, f.socket, firstUIDOfA+uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, nc)
	}
	testwait.Within(t, 20*time.Second, "pod A's refusals", func() bool {
		return counter(t, f.srv.metrics.refused.WithLabelValues(refusedUnresolved)) == n
	})
	// Each waiting one took its slot before its refusal was counted, or
	// will; those answered at once take none.
	testwait.Within(t, 20*time.Second, "pod A's refusals waiting", func() bool {
		return f.srv.awaiting.count(podKey(podA)) == maxAwaitingPerGroup
	})
	for _, nc := range silent {
		readers.Go(func() {
			if _, err := io.ReadAll(nc); err == nil { // closed by the server, not by the test
				closed.Add(1)
			}
		})
	}
	testwait.Within(t, 20*time.Second, "the others closed at once", func() bool { return closed.Load() == n-maxAwaitingPerGroup })
	b, err := net.Dial("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	silent = append(silent, b)
	testwait.Within(t, 20*time.Second, "pod B's refusal waiting", func() bool { return f.srv.awaiting.count(podKey(podB)) == 1 })
	if w, c := f.srv.awaiting.count(podKey(podA)), closed.Load(); w != maxAwaitingPerGroup || c != n-maxAwaitingPerGroup {
		t.Errorf("pod A: %d refusals waiting and %d closed, want %d and %d", w, c, maxAwaitingPerGroup, n-maxAwaitingPerGroup)
	}
}

// rawRefusalOn is rawRefusal on a connection opened already.
func rawRefusalOn(t *testing.T, nc net.Conn) string {
	t.Helper()
	defer nc.Close()
	return rawRefusalConn(t, nc)
}

// One pod cannot fill the handshakes in flight: with the pod's share
// taken by identifications that do not end, another pod's connection is
// still identified.
func TestHandshakeSharePerPod(t *testing.T) {
	needRoot(t)
	waiting := make(chan caller.Cred, 64)
	release := make(chan struct{})
	r := podsByUID{resolve: func(ctx context.Context, cred caller.Cred) (caller.Info, error) {
		waiting <- cred
		select {
		case <-release:
		case <-ctx.Done():
			return caller.Info{}, ctx.Err()
		}
		return caller.Info{Cred: cred, PodUID: podOfUID(cred.UID)}, nil
	}}
	const max = 16
	f := start(t, func(c *Config) { c.Resolver = r; c.MaxHandshakes = max; c.DirMode = 0o755 })
	openSocketDir(t, f.socket)
	var opened []net.Conn
	defer func() {
		close(release)
		for _, nc := range opened {
			_ = nc.Close()
		}
	}()
	// Pod A opens as many as the whole cap allows. The refusals are
	// counted from before the first dial: one may be counted before the
	// last dial returns.
	refusedBefore := counter(t, f.srv.metrics.refused.WithLabelValues(refusedHandshakes))
	inFlight := 0
	for i := range max {
		nc, err := dialAs(t, f.socket, firstUIDOfA+uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		opened = append(opened, nc)
	}
	testwait.Within(t, 20*time.Second, "pod A's connections identified or refused", func() bool {
		for {
			select {
			case <-waiting:
				inFlight++
				continue
			default:
			}
			return float64(inFlight)+counter(t, f.srv.metrics.refused.WithLabelValues(refusedHandshakes))-refusedBefore == max
		}
	})
	t.Logf("pod A: %d connections being identified, %v refused", inFlight, counter(t, f.srv.metrics.refused.WithLabelValues(refusedHandshakes)))
	// Pod B connects: it is identified, whatever A holds.
	nc, err := net.Dial("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	opened = append(opened, nc)
	select {
	case cred := <-waiting:
		if podOfUID(cred.UID) != podB {
			t.Fatalf("identified uid %d, want pod B's", cred.UID)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("pod B's connection was not identified while pod A has %d in flight (refused %v)", inFlight,
			counter(t, f.srv.metrics.refused.WithLabelValues(refusedHandshakes)))
	}
}

// A connection being refused does not hold a handshake slot while it is
// told why: with one slot, a connection is identified while another one's
// silent client is still being waited for.
func TestRefusalReleasesHandshakeSlot(t *testing.T) {
	r := podsByUID{resolve: func(_ context.Context, cred caller.Cred) (caller.Info, error) {
		return caller.Info{Cred: cred, PodUID: podOfUID(cred.UID)}, nil
	}}
	f := start(t, func(c *Config) { c.Resolver = r; c.MaxHandshakes = 1; c.MaxConnsPerCaller = 1 })
	if _, err := unary(t, f.conn); err != nil {
		t.Fatal(err)
	}
	before := counter(t, f.srv.metrics.refused.WithLabelValues(refusedConnections))
	silent, err := net.Dial("unix", f.socket) // says nothing: its refusal waits for its call
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	testwait.Within(t, 20*time.Second, "the first refusal", func() bool {
		return counter(t, f.srv.metrics.refused.WithLabelValues(refusedConnections)) > before
	})
	got := rawRefusal(t, f.socket)
	if !strings.HasPrefix(got, "status:8 ") || !strings.Contains(got, SettingMaxConnsPerCaller) {
		t.Fatalf("a connection while another is told why: %q, want it identified (and refused naming %s)", got, SettingMaxConnsPerCaller)
	}
}

// Refusals are logged per pod: a pod whose processes connect as a fresh
// uid each time has its refusals logged together, and another pod's
// refusal still gets a line of its own.
func TestRefusalLogPerPod(t *testing.T) {
	needRoot(t)
	f := start(t, func(c *Config) { c.Resolver = podsByUID{}; c.DirMode = 0o755 })
	f.srv.refusals.mu.Lock()
	f.srv.refusals.interval = time.Hour // nothing flushed during the test
	f.srv.refusals.mu.Unlock()
	openSocketDir(t, f.socket)
	const uids = maxRefusalLogKeys + 44
	var wg sync.WaitGroup
	for i := range uids {
		nc, err := dialAs(t, f.socket, firstUIDOfA+uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = rawRefusalOn(t, nc) })
	}
	wg.Wait()
	if got := rawRefusal(t, f.socket); !strings.HasPrefix(got, "status:7 ") {
		t.Fatalf("pod B: %q, want refused", got)
	}
	var forB, lines int
	for _, e := range f.logs.FilterMessage("local client refused").All() {
		lines++
		if e.ContextMap()[logkeys.Caller] == podKey(podB) {
			forB++
		}
	}
	if forB != 1 {
		var callers []string
		for _, e := range f.logs.FilterMessage("local client refused").All() {
			callers = append(callers, e.ContextMap()[logkeys.Caller].(string))
		}
		t.Fatalf("pod B's refusal logged in %d lines under its pod (%d lines: %v), want 1", forB, lines, strings.Join(callers[max(0, len(callers)-5):], ","))
	}
	if lines > 4 {
		t.Errorf("%d lines for %d refusals of two pods, want a few", lines, uids+1)
	}
}

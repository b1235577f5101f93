package udsserver

import (
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http2"

	"github.com/meshagent/meshagent/internal/testwait"
)

// idleConnBudget is what one idle connection may cost the server process,
// heap and goroutine stacks together, measured through the real server
// (6.6-7.6 KiB on Linux amd64 with Go 1.26 and grpc-go 1.85): a change
// that keeps a read buffer per connection again (4 KiB), or per-connection
// state of a few hundred bytes more, goes over it. Most of it is gRPC's own
// (docs/performance.md, "Idle connections").
const idleConnBudget = 9 << 10

// idleConnGoroutines are the goroutines gRPC's server runs per connection:
// its reader, its writer (loopy) and its keepalive timer loop.
const idleConnGoroutines = 3

// openIdle opens a connection to socket and takes it through the HTTP/2
// handshake as a gRPC client does (its preface and SETTINGS, the server's
// SETTINGS acknowledged), leaving it idle: what a process that connects and
// makes no RPC costs the server.
func openIdle(t testing.TB, socket string) net.Conn {
	t.Helper()
	nc, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(nc, nc)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for got := false; !got; {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			got = true
			if err := fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
		}
	}
	return nc
}

// inUse is the heap and stack memory in use after a collection (two: the
// second shrinks the stacks of goroutines that used little of theirs).
func inUse() (heap, stack int64) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse), int64(m.StackInuse)
}

// TestIdleConnectionMemory measures what idle connections cost the server
// (with a resolver, as in node mode): each is identified at accept and then
// holds no read buffer, no pidfd and no more goroutines than gRPC's own.
// The clients are raw HTTP/2 connections of this process, whose own cost (a
// socket and a framer, dropped before measuring) is small.
func TestIdleConnectionMemory(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("measures memory (not under the race detector, whose stacks are larger)")
	}
	// Each goroutine starts with the process's average stack size (Go's
	// adaptive stack start). In this test process the average is set by
	// the goroutines of other tests and of the process's shared inotify
	// watch (udslisten watches its socket's directory through it), not by
	// parked connections: each connection's goroutine started at 8 KB, more
	// than four times the ~2.3 KB it uses while parked, and never shrank
	// (11,489-11,878 bytes per idle connection, stacks 8.0-8.3 KB). In the
	// agent, a node's parked connections are most of its goroutines and set
	// the average themselves. So the test measures, in a process of its
	// own, what a connection needs when its goroutine starts at 2 KB: it
	// holds 4 KB (6,758-7,516 bytes in all).
	const startAt2K = "adaptivestackstart=0"
	if !strings.Contains(os.Getenv("GODEBUG"), startAt2K) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestIdleConnectionMemory$", "-test.v")
		cmd.Env = append(os.Environ(), "GODEBUG="+strings.Trim(os.Getenv("GODEBUG")+","+startAt2K, ","))
		out, err := cmd.CombinedOutput()
		t.Logf("with GODEBUG=%s:\n%s", startAt2K, out)
		if err != nil {
			t.Fatalf("the measurement failed: %v", err)
		}
		return
	}
	const n = 400
	f := start(t, func(c *Config) {
		c.Resolver = twoPods{}
		c.MaxConnsPerCaller = 2 * n
		c.Logger = zap.NewNop() // the tests' log observer keeps every line: not the server's memory
	})
	if _, err := unary(t, f.conn); err != nil {
		t.Fatal(err)
	}
	openIdle(t, f.socket).Close() // warm: pools, first-use allocations
	heap0, stack0 := inUse()
	fds0 := openFDs(t)
	g0 := runtime.NumGoroutine()
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = openIdle(t, f.socket)
	}
	testwait.Within(t, 20*time.Second, "every connection counted", func() bool { return f.connsOf(podKey("uid-a")) >= n })
	heap1, stack1 := inUse()
	if got := runtime.NumGoroutine() - g0; got > idleConnGoroutines*n {
		t.Errorf("%d idle connections started %d goroutines, want at most %d per connection", n, got, idleConnGoroutines)
	}
	if got := openFDs(t) - fds0; got != 2*n {
		t.Errorf("%d idle connections opened %d files in the process, want %d (the two ends of each socket, no pidfd)", n, got, 2*n)
	}
	per := (heap1 - heap0 + stack1 - stack0) / n
	t.Logf("%d idle connections: %d bytes each (heap %d, stacks %d)", n, per, (heap1-heap0)/n, (stack1-stack0)/n)
	if per > idleConnBudget {
		t.Errorf("an idle connection costs %d bytes, want at most %d", per, idleConnBudget)
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

// openFDs counts this process's open files.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

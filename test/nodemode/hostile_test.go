package nodemode

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/podproc"
)

// forkFlood: workers loops, for dur, each making a socket, forking a
// child that takes a uid never used before, connects it and exits (a pod's
// root process with CAP_SETUID doing so), reaping the child, and keeping
// the connection for hold. It answers "forkflood made <n> failed <m>".
func forkFlood(sock string, workers int, hold, dur time.Duration) string {
	var (
		made, failed atomic.Int64
		wg, holders  sync.WaitGroup
	)
	var sa syscall.RawSockaddrUnix
	sa.Family = syscall.AF_UNIX
	for i := range len(sock) {
		sa.Path[i] = int8(sock[i])
	}
	deadline := time.Now().Add(dur)
	for w := range workers {
		wg.Go(func() {
			base := uint32(200000 + w*1000000)
			for i := uint32(0); time.Now().Before(deadline); i++ {
				fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
				if err != nil {
					failed.Add(1)
					continue
				}
				pid, errno := forkConnect(fd, base+i, &sa)
				var ws syscall.WaitStatus
				if errno == 0 {
					_, err = syscall.Wait4(pid, &ws, 0, nil)
				}
				if errno != 0 || err != nil || ws.ExitStatus() != 0 {
					failed.Add(1)
					_ = syscall.Close(fd)
					continue
				}
				made.Add(1)
				holders.Go(func() {
					time.Sleep(hold)
					_ = syscall.Close(fd)
				})
			}
		})
	}
	wg.Wait()
	holders.Wait()
	return fmt.Sprintf("forkflood made %d failed %d", made.Load(), failed.Load())
}

// forkConnect forks a child that takes uid as its uid and gid, connects
// fd to sa and exits (status 0 when connected). The child makes raw
// system calls only: it runs on one thread of a Go program, which must
// not run Go code there (forkAndExecInChild in package syscall does the
// same before exec).
//
//go:norace
//go:nosplit
func forkConnect(fd int, uid uint32, sa *syscall.RawSockaddrUnix) (int, syscall.Errno) {
	// As vfork: the child shares the parent's memory (no page tables to
	// copy: thousands a second) while the parent's thread waits for it to
	// exit, so its stack is not used by both at once.
	pid, _, errno := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.CLONE_VM|syscall.CLONE_VFORK|syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if errno != 0 || pid != 0 {
		return int(pid), errno
	}
	id := uintptr(uid)
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, id, id, id); e != 0 {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 2, 0, 0)
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, id, id, id); e != 0 {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 3, 0, 0)
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(sa)), syscall.SizeofSockaddrUnix); e != 0 {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 4, 0, 0)
	}
	syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
	return 0, 0
}

// threadFlood: threads OS threads (one process, so /proc/<pid>/stat sums
// them all) each connect, send a client's preface and SETTINGS, wait
// 200 ms, close and connect again, for dur. It answers "threadflood
// connections <n> failed <m>".
func threadFlood(sock string, threads int, dur time.Duration) string {
	debug.SetMaxThreads(threads + 1000)
	hello := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)
	var (
		conns, failed atomic.Int64
		wg            sync.WaitGroup
	)
	deadline := time.Now().Add(dur)
	for range threads {
		wg.Go(func() {
			runtime.LockOSThread() // one thread each, kept while it sleeps
			for time.Now().Before(deadline) {
				c, err := net.Dial("unix", sock)
				if err != nil {
					failed.Add(1)
				} else {
					conns.Add(1)
					_, _ = c.Write(hello)
				}
				time.Sleep(200 * time.Millisecond)
				if c != nil {
					_ = c.Close()
				}
			}
		})
	}
	wg.Wait()
	return fmt.Sprintf("threadflood connections %d failed %d", conns.Load(), failed.Load())
}

// start sends cmd to the caller and returns a channel for its answer,
// for a command that runs while the test does other things.
func (c *caller) start(cmd string) <-chan string {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, cmd+"\n"); err != nil {
		c.t.Fatalf("caller %d: %s: %v", c.cmd.Process.Pid, cmd, err)
	}
	out := make(chan string, 1)
	go func(sc *bufio.Scanner) {
		if sc.Scan() {
			out <- sc.Text()
		} else {
			out <- fmt.Sprintf("no answer (%v)", sc.Err())
		}
	}(c.out)
	return out
}

// openFDs is the number of file descriptors process pid has open.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// whileFlooding fetches as another pod until the flood answers, each
// fetch on a new connection, at most four a second (well within the pod's
// own connection rate); it returns the flood's answer and the fetches'
// latencies, failing the test for each fetch not served.
func whileFlooding(t *testing.T, other *caller, want string, flood <-chan string) (string, []time.Duration) {
	t.Helper()
	var took []time.Duration
	pace := time.NewTicker(250 * time.Millisecond)
	defer pace.Stop()
	for {
		select {
		case got := <-flood:
			return got, took
		case <-pace.C:
		}
		start := time.Now()
		got := other.fetch()
		took = append(took, time.Since(start))
		if got != want {
			t.Errorf("another pod during the flood: %q after %v", got, took[len(took)-1])
		}
	}
}

// TestNodeForkedUIDFlood: a pod whose root process forks, for 15 s, 8
// workers' children that each take a fresh uid, connect and exit while the
// parent keeps each connection 2.5 s. Such a caller can never be served:
// each connection is refused when accepted, with no gRPC transport, and
// counts against the pod its cgroup names (or, its process gone, against
// the group of exited processes), not its uid. The agent's peak RSS stays
// under 80 MB, another pod's every fetch is served within 3 s, and the
// agent's open files come back to their level when the flood stops. Before:
// 5,900-7,000 refusals held with a transport, 150-177 MB, ~8,000 fds, the
// other pod served 0 of 6 times.
func TestNodeForkedUIDFlood(t *testing.T) {
	const maxRSS, maxFetch = 80 << 10, 3 * time.Second
	ns := namespace(t, "forkuids")
	n := startNode(t, uniq("node"))
	sock := n.agent.Socket()
	hog := pod(t, ns, "hog-0", "hog", n.name)
	calm := pod(t, ns, "calm-0", "calm", n.name)
	other := startCaller(t, sock, callerOpts{podUID: string(calm.UID), shape: podproc.Systemd})
	want := "ok " + spiffe(ns, "calm")
	if got := other.fetch(); got != want {
		t.Fatalf("before the flood: %q", got)
	}
	fdsBefore := openFDs(t, n.agent.Pid())
	flooder := startCaller(t, sock, callerOpts{podUID: string(hog.UID), shape: podproc.Cgroupfs})
	got, took := whileFlooding(t, other, want, flooder.start("forkflood 8 2500 15"))
	hwm := vmHWM(t, n.agent.Pid())
	slowest := time.Duration(0)
	for _, d := range took {
		slowest = max(slowest, d)
	}
	t.Logf("%s; agent peak RSS %d kB, other pod served %d times, slowest %v; refused unresolved %v, handshakes %v",
		got, hwm, len(took), slowest, n.metric(`meshagent_socket_refused_total{reason="unresolved"}`),
		n.metric(`meshagent_socket_refused_total{reason="handshakes"}`))
	if !strings.HasPrefix(got, "forkflood made ") || strings.HasPrefix(got, "forkflood made 0 ") {
		t.Fatalf("flood: %q", got)
	}
	if hwm > maxRSS {
		t.Errorf("agent peak RSS %d kB during the flood, want under %d kB", hwm, maxRSS)
	}
	if slowest > maxFetch {
		t.Errorf("another pod's slowest fetch %v, want within %v", slowest, maxFetch)
	}
	testwait.Within(t, 30*time.Second, fmt.Sprintf("the agent to hold no more than its %d fds of before the flood", fdsBefore), func() bool {
		return openFDs(t, n.agent.Pid()) <= fdsBefore
	})
}

// TestNodeThreadFlood: a pod of 3,000 threads that each connect, send a
// client's preface, wait 200 ms and connect again, for 10 s. Another pod
// is served every time: the attacker's connections hold at most an eighth
// of the identifications in flight (the structural guarantee,
// udsserver.TestHandshakeSharePerPod), identifying one reads no file that
// grows with its threads, and its refusals give their slot back before
// they are told why. The other pod's fetch times are printed.
func TestNodeThreadFlood(t *testing.T) {
	const threads = 3000
	ns := namespace(t, "threads")
	n := startNode(t, uniq("node"))
	sock := n.agent.Socket()
	hog := pod(t, ns, "hog-0", "hog", n.name)
	calm := pod(t, ns, "calm-0", "calm", n.name)
	other := startCaller(t, sock, callerOpts{podUID: string(calm.UID), shape: podproc.Systemd})
	want := "ok " + spiffe(ns, "calm")
	if got := other.fetch(); got != want {
		t.Fatalf("before the flood: %q", got)
	}
	flooder := startCaller(t, sock, callerOpts{podUID: string(hog.UID), shape: podproc.Cgroupfs})
	got, took := whileFlooding(t, other, want, flooder.start(fmt.Sprintf("threadflood %d 10", threads)))
	slowest := time.Duration(0)
	for _, d := range took {
		slowest = max(slowest, d)
	}
	t.Logf("%s; other pod served %d times, slowest %v, all %v; refused handshakes %v, connections %v, rate %v", got, len(took), slowest, took,
		n.metric(`meshagent_socket_refused_total{reason="handshakes"}`), n.metric(`meshagent_socket_refused_total{reason="max_connections"}`),
		n.metric(`meshagent_socket_refused_total{reason="max_connection_rate"}`))
	if !strings.HasPrefix(got, "threadflood connections ") {
		t.Fatalf("flood: %q", got)
	}
}

package udsserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshagent/meshagent/internal/node/peerpidfd"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/node/podresolver"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/test/podproc"
)

// childConnectEnv makes the test binary a child that connects to the Unix
// socket it names, hands the connected socket to its parent over fd 3
// (SCM_RIGHTS), and exits when its stdin closes: the process that
// connect()ed is gone while its connection lives on in the parent.
const childConnectEnv = "UDSSERVER_TEST_CONNECT"

func childConnect(path string) int {
	c, err := net.Dial("unix", path)
	if err != nil {
		return 2
	}
	f, err := c.(*net.UnixConn).File()
	if err != nil {
		return 3
	}
	if err := syscall.Sendmsg(3, []byte{0}, syscall.UnixRights(int(f.Fd())), nil, 0); err != nil {
		return 4
	}
	buf := make([]byte, 1)
	_, _ = os.Stdin.Read(buf)
	return 0
}

// pidfdResolver answers every caller whose context carries a pidfd naming
// the caller's pid, and refuses any other.
type pidfdResolver struct{}

func (pidfdResolver) Resolve(ctx context.Context, cred caller.Cred) (caller.Info, error) {
	fd, ok := peerpidfd.FromContext(ctx)
	if !ok {
		return caller.Info{}, errors.New("no pidfd in the context")
	}
	pid, err := peerpidfd.PID(fd)
	if err != nil || pid != int(cred.PID) {
		return caller.Info{}, fmt.Errorf("pidfd names pid %d (%v), want %d", pid, err, cred.PID)
	}
	return caller.Info{Identity: pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/a/sa/b"}}, nil
}

// pidfds counts the pidfds this process holds.
func pidfds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && target == "anon_inode:[pidfd]" {
			n++
		}
	}
	return n
}

// A connection's pidfd pins its process only until the caller is resolved
// (at accept): the resolver gets it, and then it is closed, so many open
// connections hold no pidfd.
func TestPIDFDClosedOnceResolved(t *testing.T) {
	before := pidfds(t)
	f := start(t, func(c *Config) { c.Resolver = pidfdResolver{}; c.MaxConnsPerCaller = 1000 })
	const n = 100
	conns := make([]*grpc.ClientConn, n)
	for i := range conns {
		conns[i] = f.dial()
		if got, err := unary(t, conns[i]); err != nil || !strings.Contains(got, "sa/b") {
			t.Fatalf("connection %d: %q, %v", i, got, err)
		}
	}
	if got := pidfds(t) - before; got != 0 {
		t.Fatalf("%d pidfds held with %d resolved connections open, want none", got, n)
	}
}

// mapPods is a pod list by UID for podresolver.
type mapPods map[string]podindex.Pod

func (m mapPods) Get(uid string) (podindex.Pod, bool) {
	p, ok := m[uid]
	return p, ok
}

func (m mapPods) Wait(_ context.Context, uid string) (podindex.Pod, error) {
	p, ok := m[uid]
	if !ok {
		return podindex.Pod{}, errors.New("no such pod")
	}
	return p, nil
}

const testCID = "0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d"

// TestPIDReusedBeforeFirstRPC: a process connects, hands the connection to
// another process, moves to the attacker's pod and exits; its pid is given
// to a process of the victim's pod before the connection's first RPC. The
// caller is resolved at accept (the attacker, or a node process if accepted
// before it moved) and, if refused then, again at the first RPC with the
// pidfd taken at accept: never given the victim's identity.
func TestPIDReusedBeforeFirstRPC(t *testing.T) {
	const uidAttacker, uidVictim = "6f1c0a52-8d4e-4b7a-9c21-3e5d7f9a1b01", "6f1c0a52-8d4e-4b7a-9c21-3e5d7f9a1b02"
	pod := func(uid, sa string) podindex.Pod {
		return podindex.Pod{Namespace: "shop", Name: sa + "-0", UID: uid, ServiceAccount: sa, NodeName: "n",
			Phase: "Running", Identity: pki.SPIFFEIdentity("cluster.local", "shop", sa)}
	}
	r, err := podresolver.New(podresolver.Config{Pods: mapPods{uidAttacker: pod(uidAttacker, "attacker"), uidVictim: pod(uidVictim, "vault")}})
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, func(c *Config) { c.Resolver = r })

	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "ours"), os.NewFile(uintptr(pair[1]), "theirs")
	defer ours.Close()
	attacker := exec.Command(os.Args[0], "-test.run=^$")
	attacker.Env = append(os.Environ(), childConnectEnv+"="+f.socket)
	attacker.ExtraFiles = []*os.File{theirs}
	stdin, err := attacker.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := attacker.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	podproc.Move(t, attacker.Process.Pid, podproc.Cgroupfs, uidAttacker, testCID)
	t.Cleanup(func() { podproc.Kill(attacker) }) // before Move's cleanup: cleanups run last first

	// Receive the attacker's connection.
	oob := make([]byte, syscall.CmsgSpace(4))
	_, oobn, _, _, err := syscall.Recvmsg(int(ours.Fd()), make([]byte, 1), oob, 0)
	if err != nil {
		t.Fatalf("receiving the connection: %v", err)
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control messages %v, %v", msgs, err)
	}
	fds, err := syscall.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("rights %v, %v", fds, err)
	}
	file := os.NewFile(uintptr(fds[0]), "attacker-conn")
	nc, err := net.FileConn(file)
	file.Close()
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	cc, err := grpc.NewClient("passthrough:///attacker", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
			var c net.Conn
			once.Do(func() { c = nc })
			if c == nil {
				return nil, errors.New("the attacker's one connection is used up")
			}
			return c, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// Ready means the server has accepted the connection (its handshake,
	// where the pidfd is taken, is done), and no RPC has been made.
	ctx := rpcCtx(t)
	cc.Connect()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			t.Fatalf("the attacker's connection never became ready (%v)", s)
		}
	}

	// The attacker exits; the victim's process gets its pid.
	pid := attacker.Process.Pid
	stdin.Close()
	if err := attacker.Wait(); err != nil {
		t.Fatalf("attacker: %v", err)
	}
	victim := podproc.StartWithPID(t, pid)
	defer podproc.Kill(victim) // if Move fails
	podproc.Move(t, victim.Process.Pid, podproc.Cgroupfs, uidVictim, testCID)
	t.Cleanup(func() { podproc.Kill(victim) })

	var out wrapperspb.StringValue
	err = cc.Invoke(ctx, whoUnary, wrapperspb.String("who"), &out)
	switch {
	case err == nil && strings.Contains(out.GetValue(), "sa/attacker"):
		// Resolved at accept, when the pid was still the attacker's.
	case status.Code(err) == codes.PermissionDenied:
		// Accepted before it moved: refused (a node process, or one that
		// has exited), never resolved again.
	default:
		t.Fatalf("first RPC after the pid was reused: %q, %v; want the attacker's identity or PermissionDenied, the connecting process exited", out.GetValue(), err)
	}
	// The pid really names the victim now: resolved by pid alone, without
	// the connection's pidfd, it would have been given the victim's identity.
	info, err := r.Resolve(context.Background(), caller.Cred{PID: int32(pid)})
	if err != nil || info.PodUID != uidVictim {
		t.Fatalf("pid %d resolved by pid alone to %+v, %v; want the victim's pod (was the pid reused?)", pid, info, err)
	}
}

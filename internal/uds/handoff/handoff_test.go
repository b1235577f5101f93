package handoff_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/uds/handoff"
	"github.com/meshagent/meshagent/internal/uds/udslisten"
)

type paths struct{ socket, private string }

func newPaths(t *testing.T) paths {
	dir := t.TempDir()
	return paths{socket: filepath.Join(dir, "socket"), private: filepath.Join(dir, "private")}
}

// startHolder runs a holder until the returned stop is called or the test ends.
func startHolder(t *testing.T, p paths) (h *handoff.Holder, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	h = &handoff.Holder{Path: p.socket, Private: p.private}
	go func() { done <- h.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("holder: %v", err)
		}
	}
	t.Cleanup(stop)
	testwait.For(t, "the holder's private socket", func() bool { _, err := os.Stat(p.private); return err == nil })
	return h, stop
}

// handshakes says whether a gRPC client completes its HTTP/2 handshake on
// the socket, as pilot-agent's check of an existing socket does.
func handshakes(t *testing.T, socket string) bool {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc.Connect()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			return false
		}
	}
	return true
}

// heldCall starts a call on a connection the holder accepted and returns its
// outcome once it ends, with the number of connections its client made.
func heldCall(t *testing.T, socket string) (<-chan error, func() int32) {
	t.Helper()
	var dials atomic.Int32
	cc, err := grpc.NewClient("passthrough:///holder", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc.Connect()
	for st := cc.GetState(); st != connectivity.Ready; st = cc.GetState() {
		if !cc.WaitForStateChange(ctx, st) {
			t.Fatal("the held call's connection never became ready")
		}
	}
	out := make(chan error, 1)
	go func() {
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var reply emptypb.Empty
		out <- cc.Invoke(ctx, "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets", &emptypb.Empty{}, &reply)
	}()
	return out, dials.Load
}

// agentAnswer is what the test's agent answers every call with.
var agentAnswer = status.Error(codes.FailedPrecondition, "answered by the agent")

// serveAgent serves a gRPC server that answers every call with agentAnswer
// on lis, recording each caller's peer credentials; stop ends it.
func serveAgent(lis net.Listener, peers chan *unix.Ucred) (stop func()) {
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error { return agentAnswer }))
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(credListener{lis, peers})
	}()
	return func() {
		srv.Stop() // closes lis
		<-served
	}
}

func listen(t *testing.T, p paths) *udslisten.Listener {
	t.Helper()
	lis, err := udslisten.Listen(udslisten.Config{Path: p.socket, Replace: true, Handoff: p.private})
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestHolderKeepsCallsForTheAgent: the holder binds the socket and
// completes the HTTP/2 handshake on it while no agent holds it (as
// pilot-agent's check needs); a call made then waits and, once an agent takes
// the socket, is answered by the agent on the same connection (its client
// dialled once); the agent reads the caller's own credentials on it and
// accepts the next connections itself; when the agent closes, the holder
// answers again, on the same socket.
func TestHolderKeepsCallsForTheAgent(t *testing.T) {
	p := newPaths(t)
	h, _ := startHolder(t, p)
	testwait.For(t, "the holder's socket", func() bool { _, err := os.Stat(p.socket); return err == nil })
	first := inode(t, p.socket)
	if !handshakes(t, p.socket) {
		t.Fatal("no HTTP/2 handshake on the holder's socket")
	}
	held, dials := heldCall(t, p.socket)
	select {
	case err := <-held:
		t.Fatalf("a call ended while no agent was there: %v", err)
	default:
	}
	testwait.For(t, "the holder keeping the held call's connection", func() bool { return h.Parked() >= 1 })

	// The agent: a gRPC server on the socket it took.
	lis := listen(t, p)
	peers := make(chan *unix.Ucred, 16)
	stop := serveAgent(lis, peers)
	if err := <-held; status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("the held call ended with %v once the agent took the socket, want the agent's answer", err)
	}
	if n := dials(); n != 1 {
		t.Fatalf("the held call's client dialled %d times, want once (served on the connection the holder kept)", n)
	}
	next, _ := heldCall(t, p.socket)
	if err := <-next; status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a call once the agent took the socket: %v, want the agent's answer", err)
	}
	for len(peers) > 0 {
		if cred := <-peers; cred == nil || int(cred.Pid) != os.Getpid() {
			t.Fatalf("the agent's peer credentials: %+v, want this process", cred)
		}
	}
	if got := inode(t, p.socket); got != first {
		t.Fatalf("the agent bound a socket of its own (inode %d, the holder's %d)", got, first)
	}

	stop()
	if _, err := os.Stat(p.socket); err != nil {
		t.Fatalf("the agent removed the holder's socket on close: %v", err)
	}
	if !handshakes(t, p.socket) {
		t.Fatal("the holder does not answer once the agent closed")
	}
	// The next agent takes the same socket.
	again := listen(t, p)
	defer again.Close()
	if got := inode(t, p.socket); got != first {
		t.Fatalf("the next agent's socket: inode %d, want the holder's %d", got, first)
	}
}

// TestHolderLetsGoOfWhatItCannotKeep: a connection whose client went away
// while no agent was there is let go of at the next sweep; beyond
// MaxParked, a connection gets the handshake and is closed (its client
// calls again); the holder reads nothing a client sends.
func TestHolderLetsGoOfWhatItCannotKeep(t *testing.T) {
	p := newPaths(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := &handoff.Holder{Path: p.socket, Private: p.private, MaxParked: 2, SweepInterval: 10 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("holder: %v", err)
		}
	}()
	testwait.For(t, "the holder's socket", func() bool { _, err := os.Stat(p.socket); return err == nil })
	// dial connects and writes; kept says whether the holder keeps the
	// connection: one it does not may be closed before the client writes.
	dial := func(kept bool) net.Conn {
		c, err := net.Dial("unix", p.socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		// Bytes the holder must leave alone: not a valid HTTP/2 preface.
		if _, err := c.Write([]byte("not http/2")); err != nil && (kept || !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET)) {
			t.Fatal(err)
		}
		settings := make([]byte, 9)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, settings); err != nil || settings[3] != 0x4 {
			t.Fatalf("the holder's handshake: %x, %v; want a SETTINGS frame", settings, err)
		}
		return c
	}
	a, b := dial(true), dial(true)
	testwait.For(t, "two connections kept", func() bool { return h.Parked() == 2 })
	c := dial(false)
	// Closed with what its client wrote unread: EOF or a reset.
	if n, err := c.Read(make([]byte, 1)); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a third connection beyond MaxParked=2: read %d, %v; want it closed", n, err)
	}
	a.Close()
	testwait.For(t, "the closed connection let go of", func() bool { return h.Parked() == 1 })

	// The agent gets the one left, with what its client wrote, unread.
	lis := listen(t, p)
	defer lis.Close()
	got, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	buf := make([]byte, len("not http/2"))
	_ = got.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(got, buf); err != nil || string(buf) != "not http/2" {
		t.Fatalf("the agent read %q, %v from the kept connection; want what its client wrote", buf, err)
	}
	if _, err := got.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 1)
	_ = b.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(b, one); err != nil || one[0] != 'x' {
		t.Fatalf("the client read %q, %v; want the agent's byte on the same connection", one, err)
	}
}

// TestAgentGivesItsSocketToANewHolder: a holder that starts while an agent
// serves leaves the socket alone; the agent gives it the socket, and once
// the agent is gone the new holder answers on it.
func TestAgentGivesItsSocketToANewHolder(t *testing.T) {
	p := newPaths(t)
	_, stop := startHolder(t, p)
	lis := listen(t, p)
	defer lis.Close()
	sock := inode(t, p.socket)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	stop()
	h, _ := startHolder(t, p)
	if h.Holds() {
		t.Fatal("a holder that started while the agent served bound a socket of its own")
	}
	// The agent gives the socket to the new holder (it looks again every second).
	testwait.Within(t, 10*time.Second, "the agent giving its socket to the new holder", h.Holds)
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, 10*time.Second, "the new holder answering on the agent's socket", func() bool {
		return inode(t, p.socket) == sock && handshakes(t, p.socket)
	})
}

// TestTakeWaitsForAHolderStarting: an agent that starts before its holder
// waits for it; without a holder, Take fails once its context ends, saying so.
func TestTakeWaitsForAHolderStarting(t *testing.T) {
	p := newPaths(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, _, err := handoff.Take(ctx, p.private, nil); err == nil || !strings.Contains(err.Error(), "no socket holder answered") {
		t.Fatalf("Take without a holder: %v", err)
	}
	taken := make(chan error, 1)
	go func() {
		lis, err := udslisten.Listen(udslisten.Config{Path: p.socket, Replace: true, Handoff: p.private})
		if err == nil {
			err = lis.Close()
		}
		taken <- err
	}()
	startHolder(t, p)
	if err := <-taken; err != nil {
		t.Fatalf("an agent started before its holder: %v", err)
	}
}

// credListener records the peer credentials of each connection it accepts.
type credListener struct {
	net.Listener
	peers chan<- *unix.Ucred
}

func (l credListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	if raw, rerr := c.(*net.UnixConn).SyscallConn(); rerr == nil {
		_ = raw.Control(func(fd uintptr) { cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	}
	select {
	case l.peers <- cred:
	default:
	}
	return c, nil
}

package handoff_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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
// outcome once it ends.
func heldCall(t *testing.T, socket string) <-chan error {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
		var reply struct{}
		out <- cc.Invoke(ctx, "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets", nil, &reply)
	}()
	return out
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

// TestHolderAnswersWhileTheAgentIsAway: the holder binds the socket and
// answers HTTP/2 on it while no agent holds it; a call made then waits and
// ends with UNAVAILABLE once an agent takes the socket; the agent accepts
// the next connections itself, with the caller's own credentials; when the
// agent closes, the holder answers again, on the same socket.
func TestHolderAnswersWhileTheAgentIsAway(t *testing.T) {
	p := newPaths(t)
	startHolder(t, p)
	testwait.For(t, "the holder's socket", func() bool { _, err := os.Stat(p.socket); return err == nil })
	first := inode(t, p.socket)
	if !handshakes(t, p.socket) {
		t.Fatal("no HTTP/2 handshake on the holder's socket")
	}
	held := heldCall(t, p.socket)
	select {
	case err := <-held:
		t.Fatalf("a call ended while no agent was there: %v", err)
	default:
	}

	// The agent: a gRPC server with no service on the socket it took,
	// recording each caller's peer credentials.
	lis := listen(t, p)
	peers := make(chan *unix.Ucred, 16)
	srv := grpc.NewServer()
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(credListener{lis, peers})
	}()
	if err := <-held; status.Code(err) != codes.Unavailable && status.Code(err) != codes.Unimplemented {
		t.Fatalf("the held call ended with %v once the agent took the socket, want UNAVAILABLE (or the agent's answer after a retry)", err)
	}
	if err := <-heldCall(t, p.socket); status.Code(err) != codes.Unimplemented {
		t.Fatalf("a call once the agent took the socket: %v, want the agent's UNIMPLEMENTED", err)
	}
	for len(peers) > 0 {
		if cred := <-peers; cred == nil || int(cred.Pid) != os.Getpid() {
			t.Fatalf("the agent's peer credentials: %+v, want this process", cred)
		}
	}
	if got := inode(t, p.socket); got != first {
		t.Fatalf("the agent bound a socket of its own (inode %d, the holder's %d)", got, first)
	}

	srv.Stop() // closes lis
	<-served
	if _, err := os.Stat(p.socket); err != nil {
		t.Fatalf("the agent removed the holder's socket on close: %v", err)
	}
	if !handshakes(t, p.socket) {
		t.Fatal("the holder does not answer once the agent closed")
	}
	// The next agent takes the same socket.
	next := listen(t, p)
	defer next.Close()
	if got := inode(t, p.socket); got != first {
		t.Fatalf("the next agent's socket: inode %d, want the holder's %d", got, first)
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

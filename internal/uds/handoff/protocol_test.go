package handoff_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/uds/handoff"
)

// The node socket pod is replaced only when an operator deletes it
// (docs/operations.md, "Upgrading the node agent"), so a holder of one
// version lends its socket to agents of later and earlier ones. These tests
// speak the protocol in literal bytes, not through the package's
// constants: a change to what either side sends or expects fails here.
const (
	wireTake = 'T'
	wireGive = 'G'
	wireKept = 'K'
	wireConn = 'C'
	wireEnd  = 'E'
	wireNone = 'N'
)

// wireSettings is what the holder writes on a connection it keeps: an empty
// HTTP/2 SETTINGS frame.
var wireSettings = []byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0}

// readOp reads one op byte and the descriptors sent with it; the caller
// closes them.
func readOp(c *net.UnixConn) (byte, []int, error) {
	if err := c.SetReadDeadline(time.Now().Add(testwait.Timeout)); err != nil {
		return 0, nil, err
	}
	buf, oob := make([]byte, 8), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, nil, fmt.Errorf("reading an op: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return 0, nil, err
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return 0, nil, err
		}
		fds = append(fds, got...)
	}
	if n != 1 {
		closeFds(fds)
		return 0, nil, fmt.Errorf("an op of %d bytes (%q), want 1", n, buf[:n])
	}
	return buf[0], fds, nil
}

// mustReadOp is readOp on the test's goroutine: its descriptors are closed
// when the test ends.
func mustReadOp(t *testing.T, c *net.UnixConn) (byte, []int) {
	t.Helper()
	op, fds, err := readOp(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeFds(fds) })
	return op, fds
}

func closeFds(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// writeOp writes one op byte, with fd attached when fd >= 0.
func writeOp(c *net.UnixConn, op byte, fd int) error {
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if _, _, err := c.WriteMsgUnix([]byte{op}, oob, nil); err != nil {
		return fmt.Errorf("writing %q: %w", op, err)
	}
	return nil
}

func sockOpt(t *testing.T, fd, opt int) int {
	t.Helper()
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, opt)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A holder answers an agent that speaks the protocol byte by byte: 'T' gets
// 'K' with the listening socket, 'C' with each connection it kept (unread:
// what the client sent is still in it), then 'E'. An op it does not know
// (a later version's) ends that agent's connection and nothing else: the
// connections kept stay kept for the next agent.
func TestHolderSpeaksTheFixedProtocol(t *testing.T) {
	p := newPaths(t)
	startHolder(t, p)
	testwait.For(t, "the holder's socket", func() bool { _, err := os.Stat(p.socket); return err == nil })
	client, err := net.Dial("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	_ = client.SetReadDeadline(time.Now().Add(testwait.Timeout))
	got := make([]byte, len(wireSettings))
	if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, wireSettings) {
		t.Fatalf("the holder's handshake: %x, %v; want %x", got, err, wireSettings)
	}
	if _, err := client.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}

	// An op no version knows: the holder drops that agent, nothing more.
	odd, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: p.private, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer odd.Close()
	if err := writeOp(odd, 'Z', -1); err != nil {
		t.Fatal(err)
	}
	_ = odd.SetReadDeadline(time.Now().Add(testwait.Timeout))
	if n, err := odd.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("an unknown op got %d bytes, %v; want the connection closed", n, err)
	}

	agent, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: p.private, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	if err := writeOp(agent, wireTake, -1); err != nil {
		t.Fatal(err)
	}
	op, fds := mustReadOp(t, agent)
	if op != wireKept || len(fds) != 1 {
		t.Fatalf("take answered %q with %d descriptors, want %q with 1", op, len(fds), wireKept)
	}
	if sockOpt(t, fds[0], unix.SO_ACCEPTCONN) != 1 {
		t.Fatal("'K' carried no listening socket")
	}
	// It is the socket at the path: a client that connects there now is
	// accepted on it.
	lf := os.NewFile(uintptr(fds[0]), "kept listener")
	fds[0] = -1 // closed with lf
	defer lf.Close()
	fl, err := net.FileListener(lf)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	late, err := net.Dial("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	_ = fl.(*net.UnixListener).SetDeadline(time.Now().Add(testwait.Timeout))
	if c, err := fl.Accept(); err != nil {
		t.Fatalf("the socket 'K' carried accepts nothing dialled at %s: %v", p.socket, err)
	} else {
		c.Close()
	}
	op, fds = mustReadOp(t, agent)
	if op != wireConn || len(fds) != 1 {
		t.Fatalf("then %q with %d descriptors, want %q with the kept connection", op, len(fds), wireConn)
	}
	kept := os.NewFile(uintptr(fds[0]), "kept")
	fds[0] = -1 // closed with kept
	defer kept.Close()
	if err := unix.SetNonblock(int(kept.Fd()), false); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, 4)
	if _, err := io.ReadFull(kept, got); err != nil || string(got) != "ping" {
		t.Fatalf("the kept connection held %q, %v; want the client's unread \"ping\"", got, err)
	}
	if op, fds = mustReadOp(t, agent); op != wireEnd || len(fds) != 0 {
		t.Fatalf("then %q with %d descriptors, want %q alone", op, len(fds), wireEnd)
	}
}

// fakeHolder accepts one agent on the private socket, checks that it sends
// 'T' and runs answer on the connection.
func fakeHolder(t *testing.T, private string, answer func(*net.UnixConn)) <-chan struct{} {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: private, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer l.Close()
		c, err := l.AcceptUnix()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		buf := make([]byte, 8)
		if n, err := c.Read(buf); err != nil || n != 1 || buf[0] != wireTake {
			t.Errorf("the agent opened with %q, %v; want %q", buf[:n], err, wireTake)
			return
		}
		answer(c)
	}()
	return done
}

// An agent takes from a holder that speaks the protocol byte by byte: 'K',
// 'C', 'E' give it the socket and the kept connection; 'N' has it bind the
// socket and give it back with 'G'.
func TestAgentSpeaksTheFixedProtocol(t *testing.T) {
	t.Run("kept", func(t *testing.T) {
		p := newPaths(t)
		lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: p.socket, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		client, err := net.Dial("unix", p.socket)
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		server, err := lis.AcceptUnix()
		if err != nil {
			t.Fatal(err)
		}
		defer server.Close()
		done := fakeHolder(t, p.private, func(c *net.UnixConn) {
			lf, _ := lis.File()
			sf, _ := server.File()
			defer lf.Close()
			defer sf.Close()
			for _, w := range []struct {
				op byte
				fd int
			}{{wireKept, int(lf.Fd())}, {wireConn, int(sf.Fd())}, {wireEnd, -1}} {
				if err := writeOp(c, w.op, w.fd); err != nil {
					t.Error(err)
					return
				}
			}
			_, _ = c.Read(make([]byte, 1)) // until the agent lets go
		})
		ctx, cancel := context.WithTimeout(context.Background(), testwait.Timeout)
		defer cancel()
		taken, att, err := handoff.Take(ctx, p.private, nil)
		if err != nil {
			t.Fatalf("Take: %v", err)
		}
		if taken.Listener == nil || len(taken.Waiting) != 1 {
			t.Fatalf("took %v and %d connections, want the socket and 1", taken.Listener, len(taken.Waiting))
		}
		if _, err := client.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(taken.Waiting[0], got); err != nil || string(got) != "ping" {
			t.Fatalf("the taken connection read %q, %v", got, err)
		}
		taken.Close()
		att.Close()
		<-done
	})
	t.Run("none", func(t *testing.T) {
		p := newPaths(t)
		given := make(chan bool, 1)
		done := fakeHolder(t, p.private, func(c *net.UnixConn) {
			if err := writeOp(c, wireNone, -1); err != nil {
				t.Error(err)
				given <- false
				return
			}
			op, fds, err := readOp(c)
			defer closeFds(fds)
			if err != nil {
				t.Error(err)
			}
			listening := len(fds) == 1
			if listening {
				v, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
				listening = err == nil && v == 1
			}
			given <- op == wireGive && listening
		})
		ctx, cancel := context.WithTimeout(context.Background(), testwait.Timeout)
		defer cancel()
		_, att, err := handoff.Take(ctx, p.private, nil)
		if !errors.Is(err, handoff.ErrNoSocket) {
			t.Fatalf("Take after 'N': %v, want ErrNoSocket", err)
		}
		lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: p.socket, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		if err := att.Give(lis); err != nil {
			t.Fatal(err)
		}
		if !<-given {
			t.Fatalf("the agent did not give its listening socket with %q", wireGive)
		}
		att.Close()
		<-done
	})
}

package udsserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/meshagent/meshagent/internal/testwait"
)

// A gRPC client's connection made ready and left without a call is parked
// (counted against its pod, not yet gRPC's), and its first call is served.
func TestParkedConnectionServesItsFirstCall(t *testing.T) {
	f := start(t, func(c *Config) { c.Resolver = twoPods{} })
	ctx := rpcCtx(t)
	f.conn.Connect()
	for s := f.conn.GetState(); s != connectivity.Ready; s = f.conn.GetState() {
		if !f.conn.WaitForStateChange(ctx, s) {
			t.Fatalf("the connection did not get ready: %v", s)
		}
	}
	testwait.Within(t, 20*time.Second, "the ready connection parked", func() bool { return f.srv.parked.len() == 1 })
	if got := f.connsOf(podKey("uid-a")); got != 1 {
		t.Fatalf("the parked connection counts %d against its pod, want 1", got)
	}
	got, err := unary(t, f.conn)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, `pod="a/p"`) {
		t.Fatalf("first call on a parked connection answered %q, want the caller a/p", got)
	}
	if n := f.srv.parked.len(); n != 0 {
		t.Fatalf("%d connections parked after the call, want 0", n)
	}
	if _, err := stream(t, f.conn); err != nil {
		t.Fatal(err)
	}
}

// A parked connection's first frame other than the acknowledgement of the
// server's SETTINGS hands it to gRPC, which answers it: a PING is answered.
// gRPC's SETTINGS, sent at hand-off, are those the server sent parked.
func TestParkedConnectionHandsOffAtAnyFrame(t *testing.T) {
	f := start(t, nil)
	if _, err := unary(t, f.conn); err != nil { // the socket is served
		t.Fatal(err)
	}
	nc := openIdle(t, f.socket)
	defer nc.Close()
	testwait.Within(t, 20*time.Second, "the connection parked", func() bool { return f.srv.parked.len() == 1 })
	fr := http2.NewFramer(nc, nc)
	data := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	if err := fr.WritePing(false, data); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var grpcSettings []http2.Setting
	for {
		fm, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("waiting for the PING's answer: %v", err)
		}
		if sf, ok := fm.(*http2.SettingsFrame); ok && !sf.IsAck() {
			grpcSettings = settingsOf(sf)
		}
		if p, ok := fm.(*http2.PingFrame); ok {
			if !p.IsAck() || p.Data != data {
				t.Fatalf("got PING ack=%v data=%v, want the answer to %v", p.IsAck(), p.Data, data)
			}
			break
		}
	}
	fm, err := http2.NewFramer(nil, bytes.NewReader(f.srv.settingsFrame)).ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if parked := settingsOf(fm.(*http2.SettingsFrame)); !slices.Equal(parked, grpcSettings) {
		t.Fatalf("SETTINGS sent parked %v, gRPC's %v: want the same", parked, grpcSettings)
	}
}

func settingsOf(f *http2.SettingsFrame) []http2.Setting {
	var out []http2.Setting
	_ = f.ForeachSetting(func(s http2.Setting) error { out = append(out, s); return nil })
	slices.SortFunc(out, func(a, b http2.Setting) int { return int(a.ID) - int(b.ID) })
	return out
}

// A connection that stays parked for IdleTimeout is closed and given back
// to its caller's count; one that does not speak HTTP/2 is closed at once.
func TestParkedConnectionClosed(t *testing.T) {
	f := start(t, func(c *Config) { c.Resolver = twoPods{}; c.IdleTimeout = 100 * time.Millisecond })
	if _, err := unary(t, f.conn); err != nil { // the socket is served
		t.Fatal(err)
	}
	nc := openIdle(t, f.socket)
	defer nc.Close()
	waitClosed(t, nc, "the idle connection")
	testwait.Within(t, 20*time.Second, "the closed connection is given back", func() bool { return f.connsOf(podKey("uid-a")) == 0 })

	for _, hello := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n......",                            // not HTTP/2
		http2.ClientPreface + "\x00\x00\x08\x06\x00\x00\x00\x00\x00abcdefgh", // a PING first
	} {
		nc, err := net.Dial("unix", f.socket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(nc, hello); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, nc, fmt.Sprintf("the connection that sent %q", hello))
		_ = nc.Close()
	}
}

// Stopping the server closes parked connections (gRPC's Stop waits for
// connections in their handshake).
func TestStopClosesParkedConnections(t *testing.T) {
	socket := shortDir(t) + "/socket"
	srv, err := New(Config{SocketPath: socket, Services: []func(*grpc.Server){registerWho}, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var nc net.Conn
	testwait.Within(t, 20*time.Second, "the socket served", func() bool {
		c, err := net.Dial("unix", socket)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	nc = openIdle(t, socket)
	defer nc.Close()
	testwait.Within(t, 20*time.Second, "the connection parked", func() bool { return srv.parked.len() == 1 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return with a parked connection open")
	}
	waitClosed(t, nc, "the parked connection")
}

// waitClosed reads nc until the server closes it (an end or a reset).
func waitClosed(t *testing.T, nc net.Conn, what string) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := io.Copy(io.Discard, nc)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("%s was not closed: %v", what, err)
	}
}

// A parked connection of a pod that leaves is closed with the pod's others.
func TestParkedConnectionClosedWhenItsPodLeaves(t *testing.T) {
	f := start(t, func(c *Config) { c.Resolver = twoPods{} })
	if _, err := unary(t, f.conn); err != nil { // the socket is served
		t.Fatal(err)
	}
	nc := openIdle(t, f.socket)
	defer nc.Close()
	testwait.Within(t, 20*time.Second, "the connection parked", func() bool { return f.srv.parked.len() == 1 })
	f.srv.CallerLeft("uid-a", "was deleted")
	waitClosed(t, nc, "the parked connection of the pod that left")
	testwait.Within(t, 20*time.Second, "the connections are given back", func() bool { return f.connsOf(podKey("uid-a")) == 0 })
}

package udsserver

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

// twoPods resolves this process to pod a/p and any other process (a child
// of the test) to pod b/q.
type twoPods struct{}

func (twoPods) Resolve(_ context.Context, cred caller.Cred) (caller.Info, error) {
	if cred.PID == int32(os.Getpid()) {
		return caller.Info{Identity: pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/a/sa/p"}, Pod: "a/p", PodUID: "uid-a"}, nil
	}
	return caller.Info{Identity: pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/b/sa/q"}, Pod: "b/q", PodUID: "uid-b"}, nil
}

// otherPod makes one call as another process (pod b/q) and checks it is
// served.
func otherPod(t *testing.T, socket string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childWhoEnv+"="+socket)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("other pod: %v", err)
	}
	if !strings.Contains(string(out), `pod="b/q"`) {
		t.Fatalf("other pod not served while pod a/p is at its limit: %s", out)
	}
}

// callerOf returns the state of the caller key, or nil.
func (f *fixture) callerOf(key string) *callerState {
	f.srv.callers.mu.Lock()
	defer f.srv.callers.mu.Unlock()
	return f.srv.callers.m[key]
}

func (f *fixture) connsOf(key string) int {
	f.srv.callers.mu.Lock()
	defer f.srv.callers.mu.Unlock()
	if st := f.srv.callers.m[key]; st != nil {
		return len(st.conns)
	}
	return 0
}

func wantExhausted(t *testing.T, err error, setting string) {
	t.Helper()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), setting) {
		t.Fatalf("%v, want ResourceExhausted naming %s", err, setting)
	}
}

// One pod holds at most MaxConnsPerCaller connections; one more is refused,
// naming the setting, while another pod is served; a closed connection
// gives its place back.
func TestConnectionsPerCaller(t *testing.T) {
	f := start(t, func(c *Config) { c.Resolver = twoPods{}; c.MaxConnsPerCaller = 3 })
	conns := []*grpc.ClientConn{f.conn, f.dial(), f.dial()}
	for i, c := range conns {
		if _, err := unary(t, c); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	_, err := unary(t, f.dial())
	wantExhausted(t, err, SettingMaxConnsPerCaller)
	if got := counter(t, f.srv.metrics.refused.WithLabelValues(refusedConnections)); got < 1 {
		t.Errorf("refused{max_connections} = %v", got)
	}
	otherPod(t, f.socket)

	_ = conns[1].Close()
	testwait.Within(t, 20*time.Second, "the closed connection is given back", func() bool { return f.connsOf(podKey("uid-a")) < 3 })
	if _, err := unary(t, f.dial()); err != nil {
		t.Fatalf("after a connection closed: %v", err)
	}
}

// One pod is served at most MaxUnaryPerCaller unary calls at once.
func TestUnaryCallsPerCaller(t *testing.T) {
	f := start(t, func(c *Config) { c.Resolver = twoPods{}; c.MaxUnaryPerCaller = 2 })
	if _, err := unary(t, f.conn); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			var out wrapperspb.StringValue
			_ = f.conn.Invoke(ctx, whoUnary, wrapperspb.String("block"), &out)
		})
	}
	testwait.Within(t, 20*time.Second, "two calls being served", func() bool { return f.callerOf(podKey("uid-a")).unary.Load() == 2 })
	_, err := unary(t, f.dial()) // another connection of the same pod
	wantExhausted(t, err, SettingMaxUnaryPerCaller)
	otherPod(t, f.socket)
	cancel()
	wg.Wait()
	// The clients gave up; the server sees the cancellations a moment later.
	testwait.Within(t, 20*time.Second, "the calls ended", func() bool { return f.callerOf(podKey("uid-a")).unary.Load() == 0 })
	if _, err := unary(t, f.conn); err != nil {
		t.Fatalf("after the calls ended: %v", err)
	}
}

// h2Client speaks raw HTTP/2 to the socket, as a hostile client would: it
// sets its stream window to 0, sends calls and never reads their data.
type h2Client struct {
	t   *testing.T
	nc  net.Conn
	wmu sync.Mutex
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer

	mu         sync.Mutex
	maxStreams uint32
	ended      map[uint32]string // stream: "rst:<code>", "status:<code> <message>", or "headers"
}

func dialH2(t *testing.T, socket string) *h2Client {
	t.Helper()
	nc, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	c := &h2Client{t: t, nc: nc, fr: http2.NewFramer(nc, nc), ended: map[uint32]string{}}
	c.enc = hpack.NewEncoder(&c.hb)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	go c.read()
	return c
}

func (c *h2Client) read() {
	dec := hpack.NewDecoder(4096, nil)
	for {
		fr, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		c.mu.Lock()
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if v, ok := fr.Value(http2.SettingMaxConcurrentStreams); ok {
				c.maxStreams = v
			}
			if !fr.IsAck() {
				c.wmu.Lock()
				_ = c.fr.WriteSettingsAck()
				c.wmu.Unlock()
			}
		case *http2.RSTStreamFrame:
			c.ended[fr.StreamID] = "rst:" + fr.ErrCode.String()
		case *http2.HeadersFrame:
			fields, _ := dec.DecodeFull(fr.HeaderBlockFragment())
			got := "headers"
			for _, h := range fields {
				if h.Name == "grpc-status" {
					got = "status:" + h.Value + got[len("headers"):]
				}
			}
			for _, h := range fields {
				if h.Name == "grpc-message" && strings.HasPrefix(got, "status:") {
					got += " " + h.Value
				}
			}
			if prev := c.ended[fr.StreamID]; !strings.HasPrefix(prev, "status:") {
				c.ended[fr.StreamID] = got
			}
		}
		c.mu.Unlock()
	}
}

// call opens stream id with one request to method and ends its side.
func (c *h2Client) call(id uint32, method string, req proto.Message) {
	c.t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.hb.Reset()
	for _, h := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "localhost"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = c.enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hb.Bytes(), EndHeaders: true}); err != nil {
		c.t.Fatal(err)
	}
	body, err := proto.Marshal(req)
	if err != nil {
		c.t.Fatal(err)
	}
	msg := make([]byte, 5+len(body))
	binary.BigEndian.PutUint32(msg[1:5], uint32(len(body)))
	copy(msg[5:], body)
	if err := c.fr.WriteData(id, true, msg); err != nil {
		c.t.Fatal(err)
	}
}

// answered returns how many of the streams got an answer, and those ended
// with a status or reset, by what ended them.
func (c *h2Client) answered() (int, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, e := range c.ended {
		if e != "headers" {
			out[e]++
		}
	}
	return len(c.ended), out
}

// A connection that sets its window to 0 and sends calls it never reads:
// the server advertises MaxStreamsPerConn, and the responses queued for
// the pod stay within MaxQueuedBytesPerCaller (and one response); the calls
// beyond are refused naming the setting, and another pod is served.
func TestWindowZeroFlood(t *testing.T) {
	const limit, size, calls = 64 << 10, 16 << 10, 200
	f := start(t, func(c *Config) {
		c.Resolver = twoPods{}
		c.MaxStreamsPerConn = 8
		c.MaxQueuedBytesPerCaller = limit
		c.MaxUnaryPerCaller = 1000
	})
	if _, err := unary(t, f.conn); err != nil { // the socket is up
		t.Fatal(err)
	}
	h := dialH2(t, f.socket)
	for i := range calls {
		h.call(uint32(2*i+1), whoUnary, wrapperspb.String("big:16384"))
	}
	testwait.Within(t, 20*time.Second, "every call answered", func() bool { n, _ := h.answered(); return n == calls })
	h.mu.Lock()
	maxStreams := h.maxStreams
	h.mu.Unlock()
	if maxStreams != 8 {
		t.Errorf("server advertised MAX_CONCURRENT_STREAMS %d, want 8", maxStreams)
	}
	_, ended := h.answered()
	refusedQueued := 0
	for e, n := range ended {
		if strings.HasPrefix(e, "status:8") && strings.Contains(e, SettingMaxQueuedPerCaller) {
			refusedQueued += n
		}
	}
	if refusedQueued == 0 {
		t.Fatalf("no call refused for queued bytes; calls ended %v", ended)
	}
	if q := f.callerOf(podKey("uid-a")).queued.Load(); q > limit+size+1024 {
		t.Fatalf("%d bytes queued for the pod, want at most %d and one response", q, limit)
	}
	otherPod(t, f.socket)
}

// Streams beyond MaxStreamsPerConn on one connection are refused (HTTP/2
// REFUSED_STREAM); the others are served.
func TestStreamsPerConnection(t *testing.T) {
	f := start(t, func(c *Config) { c.Resolver = twoPods{}; c.MaxStreamsPerConn = 4; c.MaxUnaryPerCaller = 1000 })
	if _, err := unary(t, f.conn); err != nil {
		t.Fatal(err)
	}
	h := dialH2(t, f.socket)
	for i := range 4 {
		h.call(uint32(2*i+1), whoUnary, wrapperspb.String("block"))
	}
	testwait.Within(t, 20*time.Second, "four calls being served", func() bool { return f.callerOf(podKey("uid-a")).unary.Load() == 4 })
	for i := 4; i < 10; i++ {
		h.call(uint32(2*i+1), whoUnary, wrapperspb.String("block"))
	}
	testwait.Within(t, 20*time.Second, "six calls refused", func() bool {
		_, ended := h.answered()
		return ended["rst:"+http2.ErrCodeRefusedStream.String()] == 6
	})
	otherPod(t, f.socket)
}

// A connection without an RPC for IdleTimeout is closed.
func TestIdleConnectionClosed(t *testing.T) {
	f := start(t, func(c *Config) { c.IdleTimeout = 50 * time.Millisecond })
	if _, err := unary(t, f.conn); err != nil {
		t.Fatal(err)
	}
	ctx := rpcCtx(t)
	for s := f.conn.GetState(); s == connectivity.Ready; s = f.conn.GetState() {
		if !f.conn.WaitForStateChange(ctx, s) {
			t.Fatal("the idle connection was not closed")
		}
	}
	testwait.Within(t, 20*time.Second, "the closed connection is given back", func() bool { return f.connsOf("uid:"+strconv.Itoa(os.Getuid())) == 0 })
}

// When its pod leaves, a connection's streams end with PermissionDenied
// naming why, and new calls on it are refused; another pod is not touched.
func TestCallerLeftEndsItsConnections(t *testing.T) {
	f := start(t, func(c *Config) { c.Resolver = twoPods{} })
	// Client-streaming too, so the client does not half-close: the handler
	// waits in RecvMsg, as SDS's does.
	s, err := f.conn.NewStream(rpcCtx(t), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, whoStream, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SendMsg(wrapperspb.String("wait")); err != nil {
		t.Fatal(err)
	}
	var first wrapperspb.StringValue
	if err := s.RecvMsg(&first); err != nil {
		t.Fatal(err)
	}
	f.srv.CallerLeft("uid-a", "was deleted")
	err = s.RecvMsg(&first)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "was deleted") {
		t.Fatalf("open stream after its pod left: %v, want PermissionDenied naming why", err)
	}
	var out wrapperspb.StringValue
	err = f.conn.Invoke(rpcCtx(t), whoUnary, wrapperspb.String("who"), &out)
	if status.Code(err) != codes.PermissionDenied && status.Code(err) != codes.Unavailable {
		t.Fatalf("new call on the connection: %q, %v; want it refused", out.GetValue(), err)
	}
	otherPod(t, f.socket)
}

// A window-zero client that sends empty SETTINGS frames makes the server
// write acknowledgements, which are not responses drained: the responses
// let in stay within MaxQueuedBytesPerCaller (and one response).
func TestSettingsFramesDoNotDrainQueue(t *testing.T) {
	const limit, size, calls = 64 << 10, 2 << 10, 100
	f := start(t, func(c *Config) {
		c.Resolver = twoPods{}
		c.MaxStreamsPerConn = calls
		c.MaxQueuedBytesPerCaller = limit
		c.MaxUnaryPerCaller = 1000
	})
	if _, err := unary(t, f.conn); err != nil { // the socket is up
		t.Fatal(err)
	}
	h := dialH2(t, f.socket)
	for i := range calls {
		h.call(uint32(2*i+1), whoUnary, wrapperspb.String("big:2048"))
		testwait.Within(t, 20*time.Second, "the call answered", func() bool { n, _ := h.answered(); return n == i+1 })
		h.wmu.Lock()
		for range 20 {
			_ = h.fr.WriteSettings()
		}
		h.wmu.Unlock()
	}
	n, ended := h.answered()
	queued := n
	for e, k := range ended {
		if strings.HasPrefix(e, "status:") {
			queued -= k
		}
	}
	if want := limit/size + 1; queued > want {
		t.Fatalf("%d responses queued for a client that never reads, want at most %d (%d bytes); calls ended %v", queued, want, limit, ended)
	}
}

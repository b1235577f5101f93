package udsserver

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

// rawRefusal connects, speaks as a gRPC client would (preface, SETTINGS, a
// call on stream 1) and returns how the server answered: "status:<code>
// <message>" for the call, then " goaway:<debug>"; "" when nothing came.
func rawRefusal(t *testing.T, socket string) string {
	t.Helper()
	nc, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	return rawRefusalConn(t, nc)
}

// rawRefusalConn is rawRefusal on a connection opened already.
func rawRefusalConn(t *testing.T, nc net.Conn) string {
	t.Helper()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	// Frames are written to out, then to the socket in one write: the
	// server closes the connection once it has answered, maybe before the
	// rest of a call would be written.
	var out bytes.Buffer
	flush := func() { _, _ = nc.Write(out.Bytes()); out.Reset() }
	h := &h2Client{t: t, nc: nc, fr: http2.NewFramer(&out, nc), ended: map[uint32]string{}}
	h.enc = hpack.NewEncoder(&h.hb)
	out.WriteString(http2.ClientPreface)
	_ = h.fr.WriteSettings()
	flush()
	var got []string
	called := false
	for {
		fr, err := h.fr.ReadFrame()
		if err != nil {
			return strings.Join(got, " ")
		}
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if !fr.IsAck() && !called {
				called = true
				_ = h.fr.WriteSettingsAck()
				h.call(1, whoUnary, wrapperspb.String("who"))
				flush()
			}
		case *http2.HeadersFrame:
			got = append(got, headersStatus(fr))
		case *http2.GoAwayFrame:
			got = append(got, "goaway:"+string(fr.DebugData()))
		}
	}
}

// A pod that opens many connections past MaxConnsPerCaller gets no
// transport for them: each refused one is told why at its first call
// (ResourceExhausted naming the setting) and by a GOAWAY, and closed at
// once; the refusals are counted, and logged in two lines (the first, and
// how many followed), not one each.
func TestRefusedAtHandshake(t *testing.T) {
	const flood = 300
	f := start(t, func(c *Config) { c.Resolver = twoPods{}; c.MaxConnsPerCaller = 2; c.MaxConnRatePerCaller = 1000 })
	// One interval spans the whole test, whatever the machine's speed; the
	// interval's end is played by flushAll (TestRefusalLogInterval checks
	// the timer).
	f.srv.refusals.mu.Lock()
	f.srv.refusals.interval = time.Hour
	f.srv.refusals.mu.Unlock()
	held := []*grpc.ClientConn{f.conn, f.dial()}
	for _, c := range held {
		if _, err := unary(t, c); err != nil {
			t.Fatal(err)
		}
	}
	got := rawRefusal(t, f.socket)
	if !strings.HasPrefix(got, "status:8 ") || !strings.Contains(got, SettingMaxConnsPerCaller) || !strings.Contains(got, "goaway:too many connections") {
		t.Fatalf("a connection over the limit was answered %q, want its call refused naming %s, then GOAWAY", got, SettingMaxConnsPerCaller)
	}
	_, err := unary(t, f.dial())
	wantExhausted(t, err, SettingMaxConnsPerCaller)

	var wg sync.WaitGroup
	for range flood {
		wg.Go(func() {
			nc, err := net.Dial("unix", f.socket)
			if err != nil {
				return
			}
			_, _ = nc.Write([]byte(http2.ClientPreface))
			var b [64]byte
			_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			for {
				if _, err := nc.Read(b[:]); err != nil {
					break // the server closed it
				}
			}
			_ = nc.Close()
		})
	}
	wg.Wait()
	// Each is refused at the handshake: for the pod's limit, or, when the
	// flood outruns identification on a loaded machine, for the cap on
	// handshakes in flight.
	conns := counter(t, f.srv.metrics.refused.WithLabelValues(refusedConnections))
	shakes := counter(t, f.srv.metrics.refused.WithLabelValues(refusedHandshakes))
	if conns == 0 || conns+shakes < flood {
		t.Errorf("refused{max_connections} = %v and {handshakes} = %v, want at least %d together, most for the limit (rate %v)", conns, shakes, flood,
			counter(t, f.srv.metrics.refused.WithLabelValues(refusedRate)))
	}
	if n := f.connsOf(podKey("uid-a")); n != 2 {
		t.Errorf("the pod holds %d connections, want 2", n)
	}
	// Every refusal is in the log, in a few lines: per caller, the first
	// of an interval, then how many followed.
	refused := func() (total int) {
		for _, reason := range []string{refusedConnections, refusedHandshakes, refusedRate} {
			total += int(counter(t, f.srv.metrics.refused.WithLabelValues(reason)))
		}
		return total
	}
	logged := func() (lines, refusals int) {
		lines = f.logs.FilterMessage("local client refused").Len()
		refusals = lines
		for _, e := range f.logs.FilterMessage("local client refused again").All() {
			lines++
			if n, ok := e.ContextMap()[logkeys.Refused].(int64); ok {
				refusals += int(n)
			}
		}
		return lines, refusals
	}
	keys := f.srv.refusals.flushAll()
	if lines, n := logged(); n != refused() || lines > 2*keys {
		t.Errorf("%d log lines for %d refusals of %d callers, want every refusal (%d) in at most two lines per caller", lines, n, keys, refused())
	}
	otherPod(t, f.socket)
}

// A caller opens at most max(MaxConnsPerCaller, rate) connections at once,
// then MaxConnRatePerCaller a second: one more is refused naming the
// setting, and let in once time has passed.
func TestConnectionRatePerCaller(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	f := start(t, func(c *Config) { c.Clock = clk; c.MaxConnsPerCaller = 3; c.MaxConnRatePerCaller = 1 })
	conns := []*grpc.ClientConn{f.conn, f.dial(), f.dial()}
	for _, c := range conns {
		if _, err := unary(t, c); err != nil {
			t.Fatal(err)
		}
	}
	_ = conns[2].Close()
	testwait.Within(t, 20*time.Second, "the closed connection is given back", func() bool {
		return f.connsOf(uidKey(me())) == 2
	})
	t.Cleanup(func() {
		for _, e := range f.logs.All() {
			t.Log(e.Message, e.ContextMap())
		}
	})
	got := rawRefusal(t, f.socket)
	if !strings.HasPrefix(got, "status:8 ") || !strings.Contains(got, SettingMaxConnRatePerCaller) {
		t.Fatalf("a connection over the rate was answered %q, want its call refused naming %s", got, SettingMaxConnRatePerCaller)
	}
	if got := counter(t, f.srv.metrics.refused.WithLabelValues(refusedRate)); got != 1 {
		t.Errorf("refused{max_connection_rate} = %v, want 1", got)
	}
	clk.Step(time.Second)
	if _, err := unary(t, f.dial()); err != nil {
		t.Fatalf("a second later: %v", err)
	}
}

// blocking resolves every caller once release is closed.
type blocking struct {
	waiting chan struct{}
	release chan struct{}
}

func (b blocking) Resolve(ctx context.Context, cred caller.Cred) (caller.Info, error) {
	b.waiting <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
		return caller.Info{}, ctx.Err()
	}
	return caller.Info{Cred: cred}, nil
}

// At most MaxHandshakes connections are being identified at once, an
// eighth of them of one caller; one more is refused at once, saying so.
func TestMaxHandshakes(t *testing.T) {
	b := blocking{waiting: make(chan struct{}, 8), release: make(chan struct{})}
	f := start(t, func(c *Config) { c.Resolver = b; c.MaxHandshakes = 2 * handshakeShares })
	testwait.Within(t, 20*time.Second, "the socket", func() bool { _, err := os.Stat(f.socket); return err == nil })
	var opened []net.Conn
	defer func() {
		for _, c := range opened {
			_ = c.Close()
		}
	}()
	for range 2 {
		nc, err := net.Dial("unix", f.socket)
		if err != nil {
			t.Fatal(err)
		}
		opened = append(opened, nc)
		<-b.waiting
	}
	got := rawRefusal(t, f.socket)
	close(b.release)
	if !strings.HasPrefix(got, "status:8 ") || !strings.Contains(got, "being identified") {
		t.Fatalf("a third connection of a caller while two are identified: %q, want it refused", got)
	}
	if got := counter(t, f.srv.metrics.refused.WithLabelValues(refusedHandshakes)); got != 1 {
		t.Errorf("refused{handshakes} = %v, want 1", got)
	}
}

// A caller refused for good is told why by the server's own answer: its
// first RPC gets PermissionDenied with the reason, through gRPC's client.
func TestFinalRefusalToldByGRPCClient(t *testing.T) {
	r := &resolver{known: map[int32]caller.Info{}, final: true}
	f := start(t, func(c *Config) { c.Resolver = r })
	want := fmt.Sprintf("pid %d belongs to no known pod", me().PID)
	for range 6 {
		var out wrapperspb.StringValue
		err := f.dial().Invoke(rpcCtx(t), whoUnary, wrapperspb.String("who"), &out, grpc.WaitForReady(true))
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), want) {
			t.Fatalf("%v, want PermissionDenied naming %q", err, want)
		}
	}
}

// pendingPod refuses every caller for now, naming the pod its cgroup is in
// (caller.PodOf), until the pod is learnt.
type pendingPod struct {
	mu    sync.Mutex
	known bool
	calls int
}

type podNotKnown struct{ uid string }

func (e podNotKnown) Error() string   { return "pod " + e.uid + " is not known on this node yet" }
func (e podNotKnown) Temporary() bool { return true }
func (e podNotKnown) PodUID() string  { return e.uid }

func (p *pendingPod) Resolve(_ context.Context, cred caller.Cred) (caller.Info, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	uid := "uid-b"
	if cred.PID == int32(os.Getpid()) {
		uid = "uid-a"
	}
	if !p.known {
		return caller.Info{}, podNotKnown{uid: uid}
	}
	return caller.Info{Identity: pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/a/sa/p"}, Pod: "a/p", PodUID: uid}, nil
}

// Connections accepted before their pod is known count against the pod
// their cgroup names, not against their uid (shared by other pods' Envoys),
// and are resolved again when the pod arrives, without an RPC.
func TestUnresolvedCountAgainstTheirPod(t *testing.T) {
	r := &pendingPod{}
	f := start(t, func(c *Config) { c.Resolver = r; c.MaxConnsPerCaller = 2 })
	conns := []*grpc.ClientConn{f.conn, f.dial(), f.dial()}
	for _, c := range conns {
		c.Connect()
	}
	testwait.Within(t, 20*time.Second, "two connections counted", func() bool {
		return f.connsOf(podKey("uid-a")) == 2
	})
	if n := f.connsOf(uidKey(me())); n != 0 {
		t.Fatalf("%d connections counted against the uid, want none", n)
	}
	r.mu.Lock()
	r.known = true
	before := r.calls
	r.mu.Unlock()
	f.srv.CallerArrived("uid-a")
	r.mu.Lock()
	after := r.calls
	r.mu.Unlock()
	// The refused third client reconnects on its own back-off, and each of
	// its attempts is resolved too: at least the two held connections are.
	if after-before < 2 {
		t.Fatalf("the pod's arrival resolved %d connections, want the 2 held", after-before)
	}
	for _, c := range f.srv.callers.connsOf(podKey("uid-a")) {
		if !c.tryResolved() {
			t.Errorf("connection of pid %d still unresolved", c.cred.PID)
		}
	}
}

// headersStatus is "status:<code> <message>" of a response's HEADERS.
func headersStatus(fr *http2.HeadersFrame) string {
	fields, _ := hpack.NewDecoder(4096, nil).DecodeFull(fr.HeaderBlockFragment())
	var code, msg string
	for _, h := range fields {
		switch h.Name {
		case "grpc-status":
			code = h.Value
		case "grpc-message":
			msg = h.Value
		}
	}
	return "status:" + code + " " + msg
}

// tryResolved reports whether c's caller is resolved.
func (c *conn) tryResolved() bool {
	c.lockResolve(context.Background())
	defer c.unlockResolve()
	return c.resolved
}

// flushAll logs every caller's pending refusals now, as the end of their
// interval does, and returns how many callers had some.
func (r *refusals) flushAll() int {
	r.mu.Lock()
	keys := make([]string, 0, len(r.pending))
	for k := range r.pending {
		keys = append(keys, k)
	}
	interval := r.interval
	r.mu.Unlock()
	for _, k := range keys {
		r.flush(k, interval)
	}
	return len(keys)
}

// The refusal log, on the bubble's clock: a caller's first refusal of an
// interval is logged at once, the others in one line at the interval's
// end with how many there were; after it, the next is logged at once
// again. Callers are counted apart.
func TestRefusalLogInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		core, logs := observer.New(zapcore.DebugLevel)
		r := newRefusals(zap.New(core))
		cred := caller.Cred{UID: 1000, PID: 1}
		for range 5 {
			r.log("pod:a", refusedConnections, cred, "too many")
		}
		r.log("pod:b", refusedRate, cred, "too fast")
		synctest.Wait()
		if n := logs.FilterMessage("local client refused").Len(); n != 2 {
			t.Fatalf("%d first lines, want one per caller", n)
		}
		time.Sleep(refusalLogInterval - time.Nanosecond)
		synctest.Wait()
		if n := logs.FilterMessage("local client refused again").Len(); n != 0 {
			t.Fatalf("%d lines before the interval ended, want none", n)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		again := logs.FilterMessage("local client refused again").All()
		if len(again) != 1 || again[0].ContextMap()[logkeys.Caller] != "pod:a" || again[0].ContextMap()[logkeys.Refused] != int64(4) {
			t.Fatalf("at the interval's end: %v, want one line saying pod:a was refused 4 more times", again)
		}
		r.log("pod:a", refusedConnections, cred, "too many")
		if n := logs.FilterMessage("local client refused").Len(); n != 3 {
			t.Fatalf("%d first lines after the interval, want the next refusal logged at once", n)
		}
		time.Sleep(refusalLogInterval)
		synctest.Wait()
		if n := logs.FilterMessage("local client refused again").Len(); n != 1 {
			t.Fatalf("%d lines for an interval with one refusal, want none more", n)
		}
	})
}

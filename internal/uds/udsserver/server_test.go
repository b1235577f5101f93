package udsserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(childConnectEnv); path != "" {
		os.Exit(childConnect(path))
	}
	if path := os.Getenv(childWhoEnv); path != "" {
		os.Exit(childWho(path))
	}
	goleak.VerifyTestMain(m)
}

// whoService is a gRPC service for the tests: its unary method and its
// server-streaming method answer the caller found in the RPC's context,
// formatted by describe.
const (
	whoUnary  = "/udsserver.test.Who/Unary"
	whoStream = "/udsserver.test.Who/Stream"
)

func describe(ctx context.Context) string {
	info, ok := caller.FromContext(ctx)
	if !ok {
		return "no caller"
	}
	return fmt.Sprintf("%s identity=%q pod=%q", info.Cred, info.Identity.String(), info.Pod)
}

// answer is the unary method's answer to req: the caller; for "block",
// nothing until the call ends; for "big:<n>", the caller and n more bytes.
func answer(ctx context.Context, req string) (any, error) {
	if req == "block" {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if n, ok := strings.CutPrefix(req, "big:"); ok {
		size, err := strconv.Atoi(n)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return wrapperspb.String(describe(ctx) + strings.Repeat("x", size)), nil
	}
	return wrapperspb.String(describe(ctx)), nil
}

func registerWho(gs *grpc.Server) {
	gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: "udsserver.test.Who",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Unary",
			Handler: func(_ any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
				var req wrapperspb.StringValue
				if err := dec(&req); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, _ any) (any, error) { return answer(ctx, req.GetValue()) }
				if in == nil {
					return h(ctx, &req)
				}
				return in(ctx, &req, &grpc.UnaryServerInfo{FullMethod: whoUnary}, h)
			},
		}},
		Streams: []grpc.StreamDesc{{
			StreamName:    "Stream",
			ServerStreams: true,
			ClientStreams: true, // "wait" keeps reading, as SDS does
			Handler: func(_ any, ss grpc.ServerStream) error {
				var req wrapperspb.StringValue
				if err := ss.RecvMsg(&req); err != nil {
					return err
				}
				if err := ss.SendMsg(wrapperspb.String(describe(ss.Context()))); err != nil {
					return err
				}
				if req.GetValue() == "wait" { // stay open, reading, until the stream ends
					return ss.RecvMsg(&req)
				}
				return nil
			},
		}},
	}, nil)
}

// shortDir is a temporary directory with a path short enough for a Unix
// socket address, removed when the test ends.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "uds")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

type fixture struct {
	t      *testing.T
	socket string
	srv    *Server
	reg    *prometheus.Registry
	logs   *observer.ObservedLogs
	conn   *grpc.ClientConn
}

// start runs a server with the who service, adjusted by adjust, until the
// test ends, and dials it.
func start(t *testing.T, adjust func(*Config)) *fixture {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	f := &fixture{t: t, socket: filepath.Join(shortDir(t), "run", "socket"), reg: prometheus.NewRegistry(), logs: logs}
	cfg := Config{SocketPath: f.socket, Services: []func(*grpc.Server){registerWho}, Logger: zap.New(core), Registerer: f.reg, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute, LimitNames: testLimitNames}
	if adjust != nil {
		adjust(&cfg)
	}
	var err error
	f.srv, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	f.conn = f.dial()
	return f
}

func (f *fixture) dial() *grpc.ClientConn {
	f.t.Helper()
	conn, err := grpc.NewClient("unix://"+f.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func rpcCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// unary calls the unary method, waiting for the socket to appear.
func unary(t *testing.T, conn *grpc.ClientConn) (string, error) {
	t.Helper()
	var out wrapperspb.StringValue
	err := conn.Invoke(rpcCtx(t), whoUnary, wrapperspb.String("who"), &out, grpc.WaitForReady(true))
	return out.GetValue(), err
}

// stream opens the streaming method and reads its one answer.
func stream(t *testing.T, conn *grpc.ClientConn) (string, error) {
	t.Helper()
	s, err := conn.NewStream(rpcCtx(t), &grpc.StreamDesc{ServerStreams: true}, whoStream, grpc.WaitForReady(true))
	if err != nil {
		return "", err
	}
	if err := s.SendMsg(wrapperspb.String("who")); err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	_ = s.CloseSend()
	var out wrapperspb.StringValue
	err = s.RecvMsg(&out)
	return out.GetValue(), err
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func me() caller.Cred {
	return caller.Cred{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), PID: int32(os.Getpid())}
}

// Without a resolver every RPC carries the kernel's credentials of its
// connection, and nothing else.
func TestCallerWithoutResolver(t *testing.T) {
	f := start(t, nil)
	want := fmt.Sprintf("%s identity=\"\" pod=\"\"", me())
	for name, call := range map[string]func(*testing.T, *grpc.ClientConn) (string, error){"unary": unary, "stream": stream} {
		got, err := call(t, f.conn)
		if err != nil || got != want {
			t.Fatalf("%s: %q, %v; want %q", name, got, err, want)
		}
	}
	logged := f.logs.FilterMessage("local client connected").All()
	if len(logged) != 1 {
		t.Fatalf("connection logged %d times, want once", len(logged))
	}
	if fields := logged[0].ContextMap(); fields[logkeys.UID] != me().UID || fields[logkeys.PID] != me().PID {
		t.Fatalf("logged %v, want uid %d pid %d", fields, me().UID, me().PID)
	}
}

func TestAllowedUIDs(t *testing.T) {
	t.Run("not allowed", func(t *testing.T) {
		f := start(t, func(c *Config) { c.AllowedUIDs = []uint32{me().UID + 1} })
		if _, err := unary(t, f.conn); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not allowed") {
			t.Fatalf("unary: %v, want PermissionDenied", err)
		}
		if _, err := stream(t, f.conn); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("stream: %v, want PermissionDenied", err)
		}
		if got := counter(t, f.srv.metrics.refused.WithLabelValues(refusedUID)); got != 2 {
			t.Errorf("refused{uid} = %v, want 2", got)
		}
	})
	t.Run("allowed", func(t *testing.T) {
		f := start(t, func(c *Config) { c.AllowedUIDs = []uint32{me().UID + 1, me().UID} })
		if _, err := unary(t, f.conn); err != nil {
			t.Fatal(err)
		}
		if _, err := stream(t, f.conn); err != nil {
			t.Fatal(err)
		}
	})
}

// resolver answers from a table of pids, counting its calls; an unknown
// pid is refused with a reason.
type resolver struct {
	final bool // refusals are final, not temporary
	calls atomic.Int64
	mu    sync.Mutex
	known map[int32]caller.Info
}

func (r *resolver) Resolve(_ context.Context, cred caller.Cred) (caller.Info, error) {
	r.calls.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	info, ok := r.known[cred.PID]
	if !ok {
		return caller.Info{}, refusal{msg: fmt.Sprintf("pid %d belongs to no known pod", cred.PID), temporary: !r.final}
	}
	return info, nil
}

// refusal is the resolver's error; a temporary one is asked again.
type refusal struct {
	msg       string
	temporary bool
}

func (r refusal) Error() string   { return r.msg }
func (r refusal) Temporary() bool { return r.temporary }

func (r *resolver) learn(pid int32, info caller.Info) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.known[pid] = info
}

func TestResolverOncePerConnection(t *testing.T) {
	r := &resolver{known: map[int32]caller.Info{}}
	r.learn(me().PID, caller.Info{Identity: pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/a/sa/b"}, Pod: "a/p1", PodUID: "u1",
		Cred: caller.Cred{UID: 4242}}) // a resolver cannot change the credentials
	f := start(t, func(c *Config) { c.Resolver = r })
	want := fmt.Sprintf("%s identity=%q pod=%q", me(), "spiffe://cluster.local/ns/a/sa/b", "a/p1")

	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for range 20 {
		wg.Go(func() {
			if got, err := unary(t, f.conn); err != nil || got != want {
				errs <- fmt.Errorf("unary: %q, %v; want %q", got, err, want)
			}
		})
		wg.Go(func() {
			if got, err := stream(t, f.conn); err != nil || got != want {
				errs <- fmt.Errorf("stream: %q, %v; want %q", got, err, want)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := r.calls.Load(); n != 1 {
		t.Fatalf("resolver asked %d times for one connection, want once", n)
	}
	// A second connection is resolved on its own.
	if got, err := unary(t, f.dial()); err != nil || got != want {
		t.Fatalf("second connection: %q, %v", got, err)
	}
	if n := r.calls.Load(); n != 2 {
		t.Fatalf("resolver asked %d times for two connections, want twice", n)
	}
}

// A temporary refusal at accept is told at every RPC, which asks again: the
// connection is served once its pod is known.
func TestResolverTemporaryRefusal(t *testing.T) {
	r := &resolver{known: map[int32]caller.Info{}}
	f := start(t, func(c *Config) { c.Resolver = r })
	for name, call := range map[string]func(*testing.T, *grpc.ClientConn) (string, error){"unary": unary, "stream": stream} {
		_, err := call(t, f.conn)
		want := fmt.Sprintf("pid %d belongs to no known pod", me().PID)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v, want PermissionDenied naming the reason %q", name, err, want)
		}
	}
	if got := counter(t, f.srv.metrics.refused.WithLabelValues(refusedUnresolved)); got != 2 {
		t.Errorf("refused{unresolved} = %v, want 2", got)
	}
	// A refusal is not kept: once the pod is known, the same connection is served.
	r.learn(me().PID, caller.Info{Identity: pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/a/sa/late"}})
	if got, err := unary(t, f.conn); err != nil || !strings.Contains(got, "sa/late") {
		t.Fatalf("after the pod became known: %q, %v", got, err)
	}
}

// A final refusal at accept is answered by the server itself and the
// connection closed: no transport, asked once, counted against nobody.
// A new connection is a new caller, asked again.
func TestResolverFinalRefusal(t *testing.T) {
	r := &resolver{known: map[int32]caller.Info{}, final: true}
	f := start(t, func(c *Config) { c.Resolver = r })
	_, err := unary(t, f.conn)
	want := fmt.Sprintf("pid %d belongs to no known pod", me().PID)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), want) {
		t.Fatalf("%v, want PermissionDenied naming the reason %q", err, want)
	}
	if n := r.calls.Load(); n != 1 {
		t.Fatalf("resolver asked %d times, want once", n)
	}
	if n := f.connsOf(uidKey(me())); n != 0 {
		t.Fatalf("%d refused connections counted, want none", n)
	}
	r.learn(me().PID, caller.Info{Identity: pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/a/sa/late"}})
	if got, err := unary(t, f.dial()); err != nil || !strings.Contains(got, "sa/late") {
		t.Fatalf("a new connection once the caller is known: %q, %v", got, err)
	}
}

func TestMaxRecvBytes(t *testing.T) {
	f := start(t, func(c *Config) { c.MaxRecvBytes = 1024 })
	var out wrapperspb.StringValue
	err := f.conn.Invoke(rpcCtx(t), whoUnary, wrapperspb.String(strings.Repeat("x", 2048)), &out, grpc.WaitForReady(true))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("over-size request: %v, want ResourceExhausted", err)
	}
	if _, err := unary(t, f.conn); err != nil {
		t.Fatalf("the connection is not served after the refusal: %v", err)
	}
}

func TestSocketLifecycle(t *testing.T) {
	socket := filepath.Join(shortDir(t), "uds", "socket")
	services := []func(*grpc.Server){registerWho}
	run := func(t *testing.T) (stop func() error) {
		srv, err := New(Config{SocketPath: socket, Services: services, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Run(ctx) }()
		return func() error { cancel(); return <-done }
	}
	call := func(t *testing.T) {
		t.Helper()
		conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		if _, err := unary(t, conn); err != nil {
			t.Fatal(err)
		}
	}

	stop := run(t)
	call(t)
	di, err := os.Stat(filepath.Dir(socket))
	if err != nil {
		t.Fatal(err)
	}
	si, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm() != 0o750 || si.Mode().Perm() != 0o666 || si.Mode()&fs.ModeSocket == 0 {
		t.Fatalf("directory mode %v, socket mode %v; want 0750 and a 0666 socket", di.Mode(), si.Mode())
	}

	// A second server finds the socket alive and leaves it alone.
	srv2, _ := New(Config{SocketPath: socket, Services: services, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
	if err := srv2.Run(context.Background()); !errors.Is(err, ErrSocketInUse) {
		t.Fatalf("second server on a live socket: %v", err)
	}
	if _, err := os.Lstat(socket); err != nil {
		t.Fatal("the live socket was removed")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(socket); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left behind after Run: %v", err)
	}

	// A stale socket (nobody listening) is replaced.
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close()
	if _, err := os.Lstat(socket); err != nil {
		t.Fatal("could not leave a stale socket behind")
	}
	stop = run(t)
	call(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// A regular file at the path is not deleted.
	if err := os.WriteFile(socket, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv3, _ := New(Config{SocketPath: socket, Services: services, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
	if err := srv3.Run(context.Background()); err == nil || errors.Is(err, ErrSocketInUse) {
		t.Fatalf("Run over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(socket); string(b) != "mine" {
		t.Fatal("a regular file was replaced")
	}

	// In node mode (Replace) a live socket or a file at the path is replaced.
	impostor, err := net.Listen("unix", socket+".x")
	if err != nil {
		t.Fatal(err)
	}
	defer impostor.Close()
	if err := os.Rename(socket+".x", socket); err != nil {
		t.Fatal(err)
	}
	impostorInfo, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	srv4, _ := New(Config{SocketPath: socket, Services: services, Replace: true, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
	ctx4, cancel4 := context.WithCancel(context.Background())
	done4 := make(chan error, 1)
	go func() { done4 <- srv4.Run(ctx4) }()
	// Until the server has replaced it, the path is the impostor's, which
	// accepts and never answers: call only once the path changed hands.
	testwait.For(t, "the impostor's socket replaced", func() bool {
		fi, err := os.Lstat(socket)
		return err == nil && !os.SameFile(fi, impostorInfo)
	})
	call(t)
	cancel4()
	if err := <-done4; err != nil {
		t.Fatal(err)
	}

	if _, err := New(Config{SocketPath: "/" + strings.Repeat("x", 120), Services: services, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute}); err == nil {
		t.Fatal("New accepted a socket path too long for a Unix address")
	}
	if _, err := New(Config{SocketPath: socket, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute}); err == nil {
		t.Fatal("New accepted no service")
	}
}

// TestListenBeforeRun: Listen puts the socket at its path before Run is
// called (a stale one removed first), Run serves on that socket and removes
// it when it returns; a live socket makes Listen fail with ErrSocketInUse,
// and a second Listen is refused.
func TestListenBeforeRun(t *testing.T) {
	socket := filepath.Join(shortDir(t), "uds", "socket")
	services := []func(*grpc.Server){registerWho}
	if err := os.MkdirAll(filepath.Dir(socket), 0o750); err != nil {
		t.Fatal(err)
	}
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	_ = stale.Close()

	srv, err := New(Config{SocketPath: socket, Services: services, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	// Nothing runs yet, and the socket listens: a connection is accepted
	// (by the kernel, into the backlog), where the stale one refused it.
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatalf("after Listen: %v", err)
	}
	_ = c.Close()
	st, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err == nil {
		t.Error("a second Listen was accepted")
	}
	// Another server finds it alive.
	other, _ := New(Config{SocketPath: socket, Services: services, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
	if err := other.Listen(); !errors.Is(err, ErrSocketInUse) {
		t.Fatalf("Listen on a live socket: %v, want ErrSocketInUse", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := unary(t, conn); err != nil {
		t.Fatal(err)
	}
	if now, err := os.Lstat(socket); err != nil || !os.SameFile(now, st) {
		t.Errorf("Run serves another socket than the one Listen bound: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(socket); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left behind after Run: %v", err)
	}
}

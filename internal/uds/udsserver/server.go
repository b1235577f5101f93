package udsserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/internal/uds/sockprobe"
	"github.com/meshagent/meshagent/internal/uds/udslisten"
)

// MaxSocketPath is the longest path a Unix socket address can hold.
const MaxSocketPath = udslisten.MaxPath

// ErrSocketInUse is wrapped by Run's error when something already answers
// on the socket path; the socket is left alone.
var ErrSocketInUse = sockprobe.ErrInUse

// Config describes a local socket server. The bounds a setting configures
// (MaxRecvBytes and the per-caller limits but MaxHandshakes) are required:
// internal/app passes the settings' values. Other zero values get the
// defaults noted.
type Config struct {
	// SocketPath is the Unix socket to serve on. Required. Its directory is
	// created with mode 0750 (or DirMode) and the socket is made 0666, as
	// pilot-agent does.
	SocketPath string
	// DirMode, when not zero, is the mode of the directories created for
	// the socket (an existing directory is never changed). Node mode uses
	// 0755: the directory is mounted into pods whose processes run as other
	// uids, which must be able to reach the socket (who they are is asked
	// of the kernel, not of the file system). Zero: 0750.
	DirMode os.FileMode
	// Replace replaces whatever sits at SocketPath at start (node mode: a
	// socket bound by a pod before the agent started, a regular file)
	// instead of failing with ErrSocketInUse or leaving a file alone.
	Replace bool
	// Handoff is the private socket of the socket's holder (udslisten's
	// Config.Handoff); empty: none.
	Handoff string
	// Clock drives the check that the socket is still the agent's (see
	// udslisten); nil means the real clock.
	Clock clock.WithTicker
	// Services register the gRPC services served on the socket (for
	// example sds.Server.Register). At least one is required.
	Services []func(*grpc.Server)
	// MaxRecvBytes bounds the size of one received message; gRPC answers a
	// larger one with ResourceExhausted. Required.
	MaxRecvBytes int
	// AllowedUIDs, when not empty, are the only peer uids (SO_PEERCRED) let
	// in; other peers are refused with PermissionDenied. Empty lets anyone
	// who can open the socket in.
	AllowedUIDs []uint32
	// Resolver, when set, decides who the caller of each connection is; it
	// is asked once per connection, and a connection it refuses gets
	// PermissionDenied with its reason. Nil: every caller is caller.Info
	// with its credentials only (the agent's own identity).
	Resolver caller.Resolver
	// Logger receives the server's logs. Nil means no logs.
	Logger *zap.Logger
	// Registerer receives the metrics. Nil means they are not registered.
	Registerer prometheus.Registerer

	// Limits per caller: a caller is a pod when a Resolver names one, else
	// the connecting process's uid. Each refusal is ResourceExhausted
	// naming the setting (Setting... constants).

	// MaxConnsPerCaller bounds the connections one caller holds open; one
	// more is refused. Required.
	MaxConnsPerCaller int
	// MaxStreamsPerConn bounds the RPCs open at once on one connection
	// (HTTP/2 MaxConcurrentStreams). Required.
	MaxStreamsPerConn uint32
	// MaxUnaryPerCaller bounds the unary calls of one caller served at
	// once. Required.
	MaxUnaryPerCaller int
	// MaxQueuedBytesPerCaller bounds the response bytes queued for one
	// caller that its connections have not taken (a client that stops
	// reading, or sets its HTTP/2 window to 0): beyond it the caller's
	// calls are refused until it reads. Required.
	MaxQueuedBytesPerCaller int
	// IdleTimeout closes a connection without an RPC for that long.
	// Required.
	IdleTimeout time.Duration
	// LimitNames name the bounds above in their refusals. Empty names none.
	LimitNames LimitNames
	// MaxConnRatePerCaller bounds the new connections one caller opens a
	// second, after a burst of max(MaxConnsPerCaller, the rate); one more
	// is refused at its handshake. Required.
	MaxConnRatePerCaller int
	// MaxHandshakes bounds the connections being identified at once (read
	// their credentials, pinned, resolved), one pod's (or uid's) to an
	// eighth of it; one more is refused at its handshake. Default
	// DefaultMaxHandshakes.
	MaxHandshakes int
}

// The default of Config.MaxHandshakes, which no setting configures.
const (
	// DefaultMaxHandshakes: an identification takes tens of microseconds
	// (it never waits for a pod: the first RPC does), so only a flood
	// keeps more in flight.
	DefaultMaxHandshakes = 128
)

// checkBounds refuses a bound a setting configures left at zero or below,
// naming the Config field.
func (cfg *Config) checkBounds() error {
	for _, b := range []struct {
		field string
		v     int64
	}{
		{"MaxRecvBytes", int64(cfg.MaxRecvBytes)},
		{"MaxConnsPerCaller", int64(cfg.MaxConnsPerCaller)},
		{"MaxConnRatePerCaller", int64(cfg.MaxConnRatePerCaller)},
		{"MaxStreamsPerConn", int64(cfg.MaxStreamsPerConn)},
		{"MaxUnaryPerCaller", int64(cfg.MaxUnaryPerCaller)},
		{"MaxQueuedBytesPerCaller", int64(cfg.MaxQueuedBytesPerCaller)},
		{"IdleTimeout", int64(cfg.IdleTimeout)},
	} {
		if b.v <= 0 {
			return fmt.Errorf("local socket server: Config.%s %d is not positive", b.field, b.v)
		}
	}
	return nil
}

// Server serves gRPC services on a Unix socket to local callers. Create it
// with New and start it with Run.
type Server struct {
	cfg     Config
	log     *zap.Logger
	metrics *metrics
	callers callers
	// settingsFrame is the server's SETTINGS frame of the HTTP/2
	// handshake, written by park.
	settingsFrame []byte
	parked        parkedConns
	handshakes    slots
	awaiting      slots
	rate          *connRate
	refusals      *refusals
	// refusalWait is how long a refused connection waits for its client's
	// call, in nanoseconds (refusalWait; tests change it while it serves).
	refusalWait atomic.Int64
	// lis is the socket Listen bound for Run; nil until then.
	lis *udslisten.Listener
}

// New checks cfg and returns a server. It starts nothing.
func New(cfg Config) (*Server, error) {
	if cfg.SocketPath == "" {
		return nil, errors.New("local socket server: no socket path")
	}
	if len(cfg.SocketPath) > MaxSocketPath {
		return nil, fmt.Errorf("local socket server: socket path %q is longer than %d bytes", cfg.SocketPath, MaxSocketPath)
	}
	if len(cfg.Services) == 0 {
		return nil, errors.New("local socket server: no service to serve")
	}
	cfg.Services = slices.Clone(cfg.Services)
	if err := cfg.checkBounds(); err != nil {
		return nil, err
	}
	cfg.AllowedUIDs = slices.Clone(cfg.AllowedUIDs)
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	if cfg.MaxHandshakes <= 0 {
		cfg.MaxHandshakes = DefaultMaxHandshakes
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	log := cfg.Logger.Named("uds")
	s := &Server{cfg: cfg, log: log, metrics: m, callers: callers{m: map[string]*callerState{}, limitName: cfg.LimitNames.ConnsPerCaller}, refusals: newRefusals(log),
		rate: newConnRate(cfg.MaxConnRatePerCaller, max(cfg.MaxConnsPerCaller, cfg.MaxConnRatePerCaller))}
	s.refusalWait.Store(int64(refusalWait))
	s.settingsFrame = s.handshakeSettings()
	return s, nil
}

// connReadBuffer is each connection's read buffer: an SDS request or a
// Workload API call fits in it, a larger message is read in several goes.
const connReadBuffer = 4 << 10

// Listen binds the socket now, for Run to serve: the socket is then at its
// path before anything started after Listen (a readiness report) can be
// seen. A stale socket file is removed first; a live one makes Listen fail
// with ErrSocketInUse. Listen is optional (Run binds the socket itself
// otherwise) and, when called, is called once, before Run and from the
// goroutine that starts Run; Run must follow it, since only Run closes what
// Listen bound.
func (s *Server) Listen() error {
	if s.lis != nil {
		return errors.New("local socket server: Listen called twice")
	}
	lis, err := s.listen()
	if err != nil {
		return err
	}
	s.lis = lis
	return nil
}

// Run listens on the socket (unless Listen did) and serves until ctx ends
// (then it returns nil) or serving fails. A stale socket file is removed
// first; a live one makes Run fail with ErrSocketInUse. The socket is
// removed when Run returns.
func (s *Server) Run(ctx context.Context) error {
	lis := s.lis
	if lis == nil {
		var err error
		if lis, err = s.listen(); err != nil {
			return err
		}
	}
	gs := grpc.NewServer(
		grpc.Creds(peerCreds{s: s}),
		grpc.MaxConcurrentStreams(s.cfg.MaxStreamsPerConn),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: s.cfg.IdleTimeout}),
		grpc.MaxRecvMsgSize(s.cfg.MaxRecvBytes),
		// One connection per pod in node mode: gRPC's 32 KiB read buffer
		// per connection was most of the agent's heap with 1,000 pods. The
		// messages here are a few KiB; the write buffer is shared and let go
		// between writes.
		grpc.ReadBufferSize(connReadBuffer),
		grpc.SharedWriteBuffer(true),
		// A connection's header compression table would keep its client's
		// request headers (a few KiB per connection) to spare a few bytes on
		// the next request, when most connections make one: the client is
		// asked to index nothing.
		grpc.HeaderTableSize(0),
		// handshakeSettings repeats the settings these options make gRPC
		// send (streams per connection, header table size): keep them in step.
		grpc.ForceServerCodecV2(newCodec()),
		grpc.ChainUnaryInterceptor(s.unaryAdmit),
		grpc.ChainStreamInterceptor(s.streamAdmit),
	)
	for _, register := range s.cfg.Services {
		register(gs)
	}
	names := make([]string, 0, len(gs.GetServiceInfo()))
	for name := range gs.GetServiceInfo() {
		names = append(names, name)
	}
	slices.Sort(names)

	s.log.Info("serving on local socket", zap.String(logkeys.Socket, s.cfg.SocketPath), zap.Strings(logkeys.Services, names),
		zap.Int(logkeys.MaxRecvBytes, s.cfg.MaxRecvBytes), zap.Uint32s(logkeys.AllowedUIDs, s.cfg.AllowedUIDs),
		zap.Bool(logkeys.Resolver, s.cfg.Resolver != nil))
	// Streams are long-lived: Stop ends them rather than wait for clients.
	if err := lis.Serve(ctx, stopParkedFirst{Server: gs, parked: &s.parked}); err != nil {
		return fmt.Errorf("serving on %s: %w", s.cfg.SocketPath, err)
	}
	s.log.Info("local socket server stopped", zap.String(logkeys.Socket, s.cfg.SocketPath))
	return nil
}

// stopParkedFirst is the gRPC server as udslisten serves it: parked
// connections are closed before gRPC's Stop, which would otherwise wait
// for them (they are still in their handshake, to gRPC).
type stopParkedFirst struct {
	*grpc.Server
	parked *parkedConns
}

func (s stopParkedFirst) Stop() {
	s.parked.stop()
	s.Server.Stop()
}

// sidecarSocketCheck is how long a sidecar waits before looking at its
// socket again after a rebind, and how often it looks when the directory
// cannot be watched (node mode, Replace, uses
// udslisten.DefaultCheckInterval): in a sidecar only the pod's own
// containers reach the directory.
const sidecarSocketCheck = 5 * time.Second

func (s *Server) listen() (*udslisten.Listener, error) {
	check := udslisten.DefaultCheckInterval
	if !s.cfg.Replace {
		check = sidecarSocketCheck
	}
	lis, err := udslisten.Listen(udslisten.Config{
		Path: s.cfg.SocketPath, DirMode: s.cfg.DirMode, Replace: s.cfg.Replace, CheckInterval: check,
		Clock: s.cfg.Clock, Logger: s.log, Handoff: s.cfg.Handoff,
		OnRebind: func(reason string) { s.metrics.rebound.WithLabelValues(reason).Inc() },
	})
	if err != nil {
		return nil, fmt.Errorf("local socket: %w", err)
	}
	return lis, nil
}

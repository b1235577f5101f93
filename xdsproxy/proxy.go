package xdsproxy

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/uds/sockprobe"
	"github.com/meshagent/meshagent/internal/uds/udslisten"
)

var (
	// ErrNotReady is wrapped by Ready until an upstream has answered.
	ErrNotReady = errors.New("xds proxy: no answer from the control plane yet")
	// ErrSocketInUse is wrapped by Run's error when another process answers
	// on the socket path.
	ErrSocketInUse = sockprobe.ErrInUse
	// ErrNotSocket is wrapped by Run's error when something other than a
	// socket is at the socket path.
	ErrNotSocket = sockprobe.ErrNotSocket
)

// Socket permissions, as pilot-agent sets them: the directory keeps out
// other users, the socket itself lets the proxy user in.
const (
	socketDirMode  = 0o750
	socketFileMode = 0o666
	// downstreamPingMinTime is the shortest ping interval tolerated from a
	// client before gRPC closes its connection for pinging too often.
	downstreamPingMinTime = 5 * time.Second
	// connectTimeout bounds one connection attempt to the control plane
	// (TCP and TLS handshakes).
	connectTimeout = 20 * time.Second
)

// Protocol names, used as the protocol label and log field.
const (
	protoSotw  = "sotw"
	protoDelta = "delta"
)

// protocol is one of the two ADS methods.
type protocol struct {
	name       string
	method     string
	desc       *grpc.StreamDesc
	newTracker func() tracker
	// The proxy's own subscriptions (own.go): the request that subscribes,
	// the type URL of a response, and applying a response.
	ownSubscription func(*ownSub) proto.Message
	responseType    func(mem.BufferSlice) (string, error)
	applyOwn        func(*ownSub, []byte) (ownAnswer, error)
}

var (
	sotwProtocol = protocol{
		name:       protoSotw,
		method:     discovery.AggregatedDiscoveryService_StreamAggregatedResources_FullMethodName,
		desc:       &discovery.AggregatedDiscoveryService_ServiceDesc.Streams[0],
		newTracker: func() tracker { return newSotwTracker() },

		ownSubscription: sotwOwnSubscription,
		responseType:    sotwResponseType,
		applyOwn:        sotwApplyOwn,
	}
	deltaProtocol = protocol{
		name:       protoDelta,
		method:     discovery.AggregatedDiscoveryService_DeltaAggregatedResources_FullMethodName,
		desc:       &discovery.AggregatedDiscoveryService_ServiceDesc.Streams[1],
		newTracker: func() tracker { return newDeltaTracker() },

		ownSubscription: deltaOwnSubscription,
		responseType:    deltaResponseType,
		applyOwn:        deltaApplyOwn,
	}
)

// Proxy forwards ADS streams from a Unix socket to the control plane.
type Proxy struct {
	cfg      Config
	upstream controlplane.Config
	log      *zap.Logger
	metrics  *metrics

	running atomic.Bool
	ready   atomic.Bool
	// conn is the one connection to the control plane every downstream
	// stream opens its upstream streams on; set by Run before it serves.
	conn     *grpc.ClientConn
	lastErr  atomic.Pointer[string]
	streamID atomic.Uint64
}

// New checks cfg and builds a proxy. It starts nothing; Run does.
func New(cfg Config) (*Proxy, error) {
	cfg = cfg.withDefaults()
	if cfg.SocketPath == "" {
		return nil, errors.New("xds proxy: no Config.SocketPath")
	}
	if cfg.Upstream.Addr == "" {
		return nil, errors.New("xds proxy: no discovery address")
	}
	seen := map[string]bool{}
	for _, sub := range cfg.Subscriptions {
		if sub.TypeURL == "" || sub.Apply == nil || seen[sub.TypeURL] {
			return nil, fmt.Errorf("xds proxy: subscription %q needs a type URL of its own and an Apply function", sub.TypeURL)
		}
		seen[sub.TypeURL] = true
	}
	log := cfg.Logger.Named("xdsproxy")
	up := cfg.Upstream
	if up.Plaintext && up.Token != nil && !controlplane.IsLoopback(up.Addr) {
		log.Warn("plaintext discovery address is not loopback: the bearer token will not be sent",
			zap.String(logkeys.Upstream, up.Addr))
		up.Token = nil
	}
	up.DialOptions = append([]grpc.DialOption{
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(cfg.MaxMessageSize),
			grpc.MaxCallSendMsgSize(cfg.MaxMessageSize),
		),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:    cfg.KeepaliveTime,
			Timeout: cfg.KeepaliveTimeout,
		}),
		grpc.WithUserAgent("meshagent-xdsproxy"),
		// Between streams' attempts gRPC reconnects the shared connection
		// on its own, with the proxy's base and cap (gRPC's jitter rule);
		// a stream's retry after the proxy's backoff (internal/backoff)
		// cuts gRPC's wait short (see upstreamOnce), so the proxy's clock
		// decides when a waiting stream tries again.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{
				BaseDelay:  cfg.InitialBackoff,
				Multiplier: 2,
				Jitter:     0.2,
				MaxDelay:   cfg.MaxBackoff,
			},
			MinConnectTimeout: connectTimeout,
		}),
	}, up.DialOptions...)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Proxy{cfg: cfg, upstream: up, log: log, metrics: m}, nil
}

// Ready returns nil once an upstream stream has delivered a response, and an
// error wrapping ErrNotReady (with the last upstream error, if any) before.
// Run connects to the control plane at once, but streams are opened only for
// a connected client, so the proxy is not ready before the first client
// connects.
func (p *Proxy) Ready() error {
	if p.ready.Load() {
		return nil
	}
	if last := p.lastErr.Load(); last != nil {
		return fmt.Errorf("%w: %s", ErrNotReady, *last)
	}
	return ErrNotReady
}

// SocketPath is the path the proxy listens on.
func (p *Proxy) SocketPath() string { return p.cfg.SocketPath }

// Run serves the socket until ctx ends, then closes every stream, removes the
// socket and returns nil. It returns an error if the socket cannot be set up
// or serving fails. A Proxy runs once.
func (p *Proxy) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("xds proxy: Run called twice")
	}
	path := p.cfg.SocketPath
	lis, err := p.listen(path)
	if err != nil {
		return err
	}
	conn, err := controlplane.Dial(p.upstream)
	if err != nil {
		_ = lis.Close()
		return fmt.Errorf("xds proxy: upstream %s: %w", p.upstream.Addr, err)
	}
	// Connect now (or once ConnectAfter is closed), so the first client's
	// stream finds the TLS handshake done; the connection is shared by every
	// stream and outlives them.
	wctx, stopWaiting := context.WithCancel(ctx)
	waited := make(chan struct{})
	if p.cfg.ConnectAfter == nil {
		conn.Connect()
		close(waited)
	} else {
		go func() {
			defer close(waited)
			select {
			case <-p.cfg.ConnectAfter:
				conn.Connect()
			case <-wctx.Done():
			}
		}()
	}
	p.conn = conn

	p.log.Info("xds proxy listening", zap.String(logkeys.Socket, path), zap.String(logkeys.Upstream, p.upstream.Addr))
	// Serve stops the server (every stream, then waits for the handlers)
	// and closes the socket before the upstream connection is closed.
	serveErr := lis.Serve(ctx, p.newServer())
	stopWaiting()
	<-waited
	_ = conn.Close()
	if serveErr != nil {
		return fmt.Errorf("serving xds proxy socket %s: %w", path, serveErr)
	}
	p.log.Info("xds proxy stopped", zap.String(logkeys.Socket, path))
	return nil
}

// newServer is the proxy's gRPC server: the ADS service's two streams,
// each relayed raw (sotw and delta), and the limits of a local client.
func (p *Proxy) newServer() *grpc.Server {
	srv := grpc.NewServer(
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.MaxRecvMsgSize(p.cfg.MaxMessageSize),
		grpc.MaxSendMsgSize(p.cfg.MaxMessageSize),
		grpc.WaitForHandlers(true),
		// Let a local client ping as often as Envoy's keepalive might.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             downstreamPingMinTime,
			PermitWithoutStream: true,
		}),
	)
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: discovery.AggregatedDiscoveryService_ServiceDesc.ServiceName,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{
			{
				StreamName:    sotwProtocol.desc.StreamName,
				Handler:       func(_ any, ss grpc.ServerStream) error { return p.serveStream(ss, sotwProtocol) },
				ServerStreams: true,
				ClientStreams: true,
			},
			{
				StreamName:    deltaProtocol.desc.StreamName,
				Handler:       func(_ any, ss grpc.ServerStream) error { return p.serveStream(ss, deltaProtocol) },
				ServerStreams: true,
				ClientStreams: true,
			},
		},
		Metadata: discovery.AggregatedDiscoveryService_ServiceDesc.Metadata,
	}, p)
	return srv
}

// listen makes the socket's directory, clears a stale socket and listens.
func (p *Proxy) listen(path string) (*udslisten.Listener, error) {
	lis, err := udslisten.Listen(udslisten.Config{
		Path: path, DirMode: socketDirMode, SocketMode: socketFileMode, Logger: p.log,
		// Only the pod's own containers reach the directory: after a rebind
		// (or without inotify) look again slowly.
		CheckInterval: 5 * time.Second,
		OnRebind:      func(reason string) { p.metrics.socketRebound.WithLabelValues(reason).Inc() },
	})
	if err != nil {
		return nil, fmt.Errorf("xds proxy socket: %w", err)
	}
	return lis, nil
}

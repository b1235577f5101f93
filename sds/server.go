package sds

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/sockprobe"
	"github.com/meshagent/meshagent/secretmanager"
)

// Defaults of Config.
const (
	// DefaultMaxNames bounds the resource names of one request.
	DefaultMaxNames = 100
	// DefaultMaxStreams bounds the StreamSecrets streams open at once.
	DefaultMaxStreams = 4096
	// DefaultMaxRecvBytes bounds the size of one received request.
	DefaultMaxRecvBytes = 64 << 10
	// maxSocketPath is the longest path a Unix socket address can hold.
	maxSocketPath = 107
	// probeTimeout bounds the check whether an existing socket is alive.
	probeTimeout = time.Second
)

// ErrSocketInUse is wrapped by Run's error when something already answers
// on the socket path; the socket is left alone.
var ErrSocketInUse = sockprobe.ErrInUse

// SecretSource is what the server needs from the secret manager.
type SecretSource interface {
	// Secret returns the current secret for name, waiting (bounded by ctx)
	// while it is not available yet. Errors other than ctx's mean the name
	// cannot be served.
	Secret(ctx context.Context, name string) (*secretmanager.Secret, error)
	// Watch signals, on a channel with a one-slot buffer, each time the secret
	// under name is replaced; the function ends the subscription.
	Watch(name string) (<-chan struct{}, func())
}

// Config describes an SDS server. Zero values get the defaults noted.
type Config struct {
	// SocketPath is the Unix socket to serve on. Required. Its directory is
	// created with mode 0750 and the socket is made 0666, as pilot-agent does.
	SocketPath string
	// Secrets provides the secrets. Required.
	Secrets SecretSource
	// DefaultNames are served to a request that names no resource. Default
	// ["default", "ROOTCA"].
	DefaultNames []string
	// MaxNames bounds the names of one request. Default DefaultMaxNames.
	MaxNames int
	// MaxStreams bounds the StreamSecrets streams open at once; a stream over
	// the limit is refused with ResourceExhausted. Default DefaultMaxStreams.
	MaxStreams int
	// MaxRecvBytes bounds the size of one received request; gRPC answers a
	// larger one with ResourceExhausted. Default DefaultMaxRecvBytes.
	MaxRecvBytes int
	// AllowedUIDs, when not empty, are the only peer uids (SO_PEERCRED) let
	// in; other peers are refused with PermissionDenied. Empty lets anyone
	// who can open the socket in.
	AllowedUIDs []uint32
	// Clock stamps VersionInfo. Default the real clock.
	Clock clock.PassiveClock
	// Logger receives the server's logs. Nil means no logs.
	Logger *zap.Logger
	// Registerer receives the metrics. Nil means they are not registered.
	Registerer prometheus.Registerer
}

// Server serves StreamSecrets and FetchSecrets on a Unix socket. Create it
// with New and start it with Run.
type Server struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer

	cfg     Config
	log     *zap.Logger
	metrics *metrics

	versions  atomic.Uint64
	streamIDs atomic.Uint64
	open      atomic.Int64 // StreamSecrets streams being served
}

// New checks cfg and returns a server. It starts nothing.
func New(cfg Config) (*Server, error) {
	if cfg.SocketPath == "" {
		return nil, errors.New("SDS server: no socket path")
	}
	if len(cfg.SocketPath) > maxSocketPath {
		return nil, fmt.Errorf("SDS server: socket path %q is longer than %d bytes", cfg.SocketPath, maxSocketPath)
	}
	if cfg.Secrets == nil {
		return nil, errors.New("SDS server: no secret source")
	}
	if len(cfg.DefaultNames) == 0 {
		cfg.DefaultNames = []string{secretmanager.WorkloadCertName, secretmanager.RootCertName}
	}
	if cfg.MaxNames <= 0 {
		cfg.MaxNames = DefaultMaxNames
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.MaxRecvBytes <= 0 {
		cfg.MaxRecvBytes = DefaultMaxRecvBytes
	}
	cfg.AllowedUIDs = slices.Clone(cfg.AllowedUIDs)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, log: cfg.Logger.Named("sds"), metrics: m}, nil
}

// Run listens on the socket and serves until ctx ends (then it returns nil)
// or serving fails. A stale socket file is removed first; a live one makes
// Run fail with ErrSocketInUse. The socket is removed when Run returns.
func (s *Server) Run(ctx context.Context) error {
	lis, err := s.listen()
	if err != nil {
		return err
	}
	info, _ := os.Lstat(s.cfg.SocketPath)
	defer s.removeSocket(info)

	gs := grpc.NewServer(
		grpc.Creds(peerCreds{log: s.log}),
		grpc.MaxRecvMsgSize(s.cfg.MaxRecvBytes),
		grpc.ChainUnaryInterceptor(s.unaryAuth),
		grpc.ChainStreamInterceptor(s.streamAuth),
	)
	secretv3.RegisterSecretDiscoveryServiceServer(gs, s)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	s.log.Info("serving SDS", zap.String(keySocket, s.cfg.SocketPath),
		zap.Int(keyMaxStreams, s.cfg.MaxStreams), zap.Int(keyMaxRecvBytes, s.cfg.MaxRecvBytes),
		zap.Uint32s(keyAllowedUIDs, s.cfg.AllowedUIDs))

	select {
	case <-ctx.Done():
		// Streams are long-lived: end them now rather than wait for clients.
		gs.Stop()
		<-served
		s.log.Info("SDS server stopped", zap.String(keySocket, s.cfg.SocketPath))
		return nil
	case err := <-served:
		gs.Stop()
		return fmt.Errorf("serving SDS on %s: %w", s.cfg.SocketPath, err)
	}
}

func (s *Server) listen() (net.Listener, error) {
	path := s.cfg.SocketPath
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("creating SDS socket directory: %w", err)
	}
	removed, err := sockprobe.RemoveStale(context.Background(), path, probeTimeout, sockprobe.Connect)
	if err != nil {
		return nil, fmt.Errorf("SDS socket: %w", err)
	}
	if removed {
		s.log.Info("removed stale SDS socket", zap.String(keySocket, path))
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on SDS socket: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("setting SDS socket mode: %w", err)
	}
	return lis, nil
}

// removeSocket removes the socket file if it is still the one Run made.
func (s *Server) removeSocket(ours os.FileInfo) {
	now, err := os.Lstat(s.cfg.SocketPath)
	if err != nil || ours == nil || !os.SameFile(ours, now) {
		return
	}
	if err := os.Remove(s.cfg.SocketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("removing SDS socket failed", zap.Error(err))
	}
}

// FetchSecrets answers one request with the current secrets.
func (s *Server) FetchSecrets(ctx context.Context, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	resp, err := s.fetch(ctx, req)
	if err != nil {
		s.countError(err)
		return nil, err
	}
	s.metrics.pushes.WithLabelValues(pushFetch).Inc()
	return resp, nil
}

func (s *Server) fetch(ctx context.Context, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	if err := checkType(req.GetTypeUrl()); err != nil {
		return nil, err
	}
	names, err := s.names(req.GetResourceNames())
	if err != nil {
		return nil, err
	}
	secrets, err := s.resolve(ctx, names)
	if err != nil {
		return nil, err
	}
	return s.response(names, secrets)
}

// names returns the names a request stands for: its own, deduplicated in
// order, or DefaultNames when it names none.
func (s *Server) names(requested []string) ([]string, error) {
	if len(requested) > s.cfg.MaxNames {
		return nil, status.Errorf(codes.InvalidArgument, "%d resource names requested, at most %d are served", len(requested), s.cfg.MaxNames)
	}
	if len(requested) == 0 {
		return s.cfg.DefaultNames, nil
	}
	return dedupe(requested), nil
}

func dedupe(names []string) []string {
	seen := make(map[string]struct{}, len(names))
	out := make([]string, 0, len(names))
	for _, n := range names {
		if _, ok := seen[n]; !ok {
			seen[n] = struct{}{}
			out = append(out, n)
		}
	}
	return out
}

func checkType(typeURL string) error {
	if typeURL != "" && typeURL != secretTypeURL {
		return status.Errorf(codes.InvalidArgument, "type %.200q is not served here, only %s", typeURL, secretTypeURL)
	}
	return nil
}

// resolve gets every named secret. A name that cannot be served fails with
// InvalidArgument naming it; the end of ctx fails with ctx's code.
func (s *Server) resolve(ctx context.Context, names []string) ([]*secretmanager.Secret, error) {
	out := make([]*secretmanager.Secret, len(names))
	for i, name := range names {
		sec, err := s.cfg.Secrets.Secret(ctx, name)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return nil, status.FromContextError(err).Err()
			}
			return nil, status.Errorf(codes.InvalidArgument, "resource %.200q cannot be served: %v", name, err)
		}
		out[i] = sec
	}
	return out, nil
}

func (s *Server) response(names []string, secrets []*secretmanager.Secret) (*discoveryv3.DiscoveryResponse, error) {
	resources := make([]*anypb.Any, len(names))
	for i, name := range names {
		a, err := toAny(name, secrets[i])
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		resources[i] = a
	}
	return &discoveryv3.DiscoveryResponse{
		VersionInfo: s.nextVersion(),
		Resources:   resources,
		TypeUrl:     secretTypeURL,
		Nonce:       rand.Text(),
	}, nil
}

// nextVersion is a timestamp and a counter, as pilot-agent sends.
func (s *Server) nextVersion() string {
	return fmt.Sprintf("%s/%d", s.cfg.Clock.Now().UTC().Format(time.RFC3339), s.versions.Add(1))
}

func (s *Server) countError(err error) {
	code := status.Code(err)
	if code == codes.Canceled || code == codes.OK {
		return
	}
	s.metrics.errors.WithLabelValues(code.String()).Inc()
}

// secretTypeURL is the type of every resource served here. It is spelled out
// rather than taken from go-control-plane's resource package, which links
// every Envoy API into the binary.
const secretTypeURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

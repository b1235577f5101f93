package sds

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
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

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/streamlimit"
	"github.com/meshagent/meshagent/secretmanager"
)

// DefaultMaxNames bounds the resource names of one request (Config.MaxNames).
const DefaultMaxNames = 100

// SecretSource is what the server needs from the secret manager. id is the
// caller's identity as the socket server resolved it (caller.Info.Identity;
// zero for the agent's own): what "default" means depends on it only, so
// streams of callers with one identity share a watch. An error wrapping secretmanager.ErrUnknownResource or
// secretmanager.ErrNoIdentity means the name can never be served to this
// caller; other errors mean not now.
type SecretSource interface {
	// Secret returns the current secret for name, waiting (bounded by ctx)
	// while it is not available yet (FetchSecrets).
	Secret(ctx context.Context, id pki.Identity, name string) (*secretmanager.Secret, error)
	// Current returns the secret for name as it is now, never waiting
	// (streams: no name waits for another).
	Current(id pki.Identity, name string) (*secretmanager.Secret, error)
	// Watch signals, on a channel with a one-slot buffer, each time the secret
	// under name is replaced; the function ends the subscription (a resource
	// nobody watches may be released). A nil channel means the source
	// refused to watch name (unknown, no identity, a bad file, over a
	// limit): the name is then refused on the stream, whatever Secret
	// answers later, so no name is served that is not watched.
	Watch(id pki.Identity, name string) (<-chan struct{}, func())
}

// Config describes an SDS server. The bounds a setting configures
// (MaxStreams, MaxStreamsPerCaller, MaxFileNamesPerCaller) are required;
// other zero values get the defaults noted.
type Config struct {
	// Secrets provides the secrets. Required.
	Secrets SecretSource
	// DefaultNames are served to a request that names no resource. Default
	// ["default", "ROOTCA"].
	DefaultNames []string
	// MaxNames bounds the names of one request. Default DefaultMaxNames.
	MaxNames int
	// MaxStreams bounds the StreamSecrets streams open at once; a stream over
	// the limit is refused with ResourceExhausted. Required.
	MaxStreams int
	// MaxStreamsPerCaller bounds the StreamSecrets streams one caller holds
	// at once: a pod (caller.Info.PodUID), or an identity when the caller
	// has no pod, as the socket server resolved it (node mode). Callers the
	// socket server did not resolve (a sidecar's: one workload) are bounded
	// by MaxStreams only. Required.
	MaxStreamsPerCaller int
	// Callers, when set, is the per-caller stream count shared with the
	// other service on the socket, so a pod's SDS and Workload API streams
	// count together against MaxStreamsPerCaller. Nil: a count of its own.
	Callers *streamlimit.Callers
	// MaxFileNamesPerCaller bounds the file resources (names under
	// secretmanager.FileCertPrefix or FileRootPrefix) held at once by the
	// streams of one caller (its pod when the caller was resolved to one,
	// else its identity, else its connecting process: uid and pid); one
	// more is refused with ResourceExhausted naming it and the limit.
	// Required.
	MaxFileNamesPerCaller int
	// Clock stamps VersionInfo. Default the real clock.
	Clock clock.PassiveClock
	// LimitNames are what a refused stream is told to raise: the settings
	// behind MaxStreams and MaxStreamsPerCaller. Empty names are left out.
	LimitNames streamlimit.Names
	// Logger receives the server's logs. Nil means no logs.
	Logger *zap.Logger
	// Registerer receives the metrics. Nil means they are not registered.
	Registerer prometheus.Registerer
}

// Server serves StreamSecrets and FetchSecrets. Create it with New and serve
// it on a gRPC server with Register (udsserver runs the socket).
type Server struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer

	cfg     Config
	log     *zap.Logger
	metrics *metrics

	versions  atomic.Uint64
	stamp     atomic.Pointer[versionStamp]
	streamIDs atomic.Uint64

	streams *streamlimit.Limit // StreamSecrets streams being served

	// encoded holds each secret's resource, encoded once and shared by
	// every response that carries it.
	encoded encodedCache

	watchMu sync.Mutex
	watches map[watchKey]*sharedWatch
	// fileNames counts, per caller (callerKey), the streams holding each
	// file resource name; guarded by watchMu.
	fileNames map[string]map[string]int
}

// New checks cfg and returns a server. It starts nothing.
func New(cfg Config) (*Server, error) {
	if cfg.Secrets == nil {
		return nil, errors.New("SDS server: no secret source")
	}
	if len(cfg.DefaultNames) == 0 {
		cfg.DefaultNames = []string{secretmanager.WorkloadCertName, secretmanager.RootCertName}
	}
	if cfg.MaxNames <= 0 {
		cfg.MaxNames = DefaultMaxNames
	}
	for field, v := range map[string]int{"MaxStreams": cfg.MaxStreams, "MaxStreamsPerCaller": cfg.MaxStreamsPerCaller, "MaxFileNamesPerCaller": cfg.MaxFileNamesPerCaller} {
		if v <= 0 {
			return nil, fmt.Errorf("SDS server: Config.%s %d is not positive", field, v)
		}
	}
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
	return &Server{cfg: cfg, log: cfg.Logger.Named("sds"), metrics: m,
		streams: &streamlimit.Limit{Max: cfg.MaxStreams, PerCaller: cfg.MaxStreamsPerCaller, Callers: cfg.Callers,
			Service: "SDS", Names: cfg.LimitNames}}, nil
}

// Register adds the SDS service to gs.
func (s *Server) Register(gs *grpc.Server) {
	secretv3.RegisterSecretDiscoveryServiceServer(gs, s)
}

// FetchSecrets answers one request with the current secrets.
func (s *Server) FetchSecrets(ctx context.Context, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	resp, err := s.fetch(ctx, req)
	if err != nil {
		s.countError(err)
		return nil, err
	}
	s.metrics.pushFetch.Inc()
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
	secrets, err := s.resolve(ctx, identityOf(ctx), names)
	if err != nil {
		return nil, err
	}
	return s.response(names, secrets), nil
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

// resolve gets every named secret for a fetch, waiting (bounded by ctx) for
// those not available yet. A name that can never be served fails with
// InvalidArgument naming it; one still unavailable when ctx ends fails with
// ctx's code naming it; any other failure with Unavailable naming it.
func (s *Server) resolve(ctx context.Context, id pki.Identity, names []string) ([]*secretmanager.Secret, error) {
	out := make([]*secretmanager.Secret, len(names))
	for i, name := range names {
		sec, err := s.cfg.Secrets.Secret(ctx, id, name)
		switch {
		case err == nil:
			out[i] = sec
		case permanent(err):
			return nil, status.Errorf(codes.InvalidArgument, "resource %.200q cannot be served: %v", name, err)
		case ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			return nil, status.Errorf(status.FromContextError(err).Code(), "resource %.200q not available: %v", name, err)
		default:
			return nil, status.Errorf(codes.Unavailable, "resource %.200q not available: %v", name, err)
		}
	}
	return out, nil
}

func (s *Server) response(names []string, secrets []*secretmanager.Secret) *discoveryv3.DiscoveryResponse {
	resources := make([]*anypb.Any, len(names))
	for i, name := range names {
		resources[i] = s.encoded.get(name, secrets[i])
	}
	return &discoveryv3.DiscoveryResponse{
		VersionInfo: s.nextVersion(),
		Resources:   resources,
		TypeUrl:     secretTypeURL,
		Nonce:       rand.Text(),
	}
}

// nextVersion is a timestamp and a counter, as pilot-agent sends. The
// timestamp is formatted once a second: a rotation pushed to many streams
// formats it once.
func (s *Server) nextVersion() string {
	now := s.cfg.Clock.Now()
	stamp := s.stamp.Load()
	if stamp == nil || stamp.unix != now.Unix() {
		stamp = &versionStamp{unix: now.Unix(), text: now.UTC().Format(time.RFC3339)}
		s.stamp.Store(stamp)
	}
	return stamp.text + "/" + strconv.FormatUint(s.versions.Add(1), 10)
}

// versionStamp is a second and its RFC 3339 form.
type versionStamp struct {
	unix int64
	text string
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

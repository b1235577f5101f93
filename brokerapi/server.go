package brokerapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/brokerapi/brokerpb"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/tlspolicy"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/internal/uds/udslisten"
	"github.com/meshagent/meshagent/secretmanager"
)

// The security header every Broker API call must carry, as the SPIFFE
// Broker Endpoint standard requires.
const (
	headerKey   = "broker.spiffe.io"
	headerValue = "true"
)

// DefaultPodWait is Config.PodWait's default, which no setting configures.
const DefaultPodWait = 2 * time.Second

// maxRecvBytes bounds a request: a reference is a few hundred bytes.
const maxRecvBytes = 16 << 10

// SecretSource is what the server needs of the certificate cache. id is a
// workload's identity; zero is the agent's own. "default" is a
// certificate, "ROOTCA" the trust bundle.
type SecretSource interface {
	// Secret returns the secret under name, waiting (bounded by ctx) while
	// it is not available yet.
	Secret(ctx context.Context, id pki.Identity, name string) (*secretmanager.Secret, error)
	// Current returns what is held now, without waiting.
	Current(id pki.Identity, name string) (*secretmanager.Secret, error)
	// Watch signals on a one-slot channel each time the secret under name is
	// replaced; the function ends the subscription.
	Watch(id pki.Identity, name string) (<-chan struct{}, func())
}

// Pods are the node's pods. *podindex.Index implements it.
type Pods interface {
	Get(uid string) (podindex.Pod, bool)
	Wait(ctx context.Context, uid string) (podindex.Pod, error)
	ByName(namespace, name string) (podindex.Pod, bool)
}

// Broker is an allowed broker: its SPIFFE ID and the reference types it
// may use.
type Broker struct {
	ID spiffeid.ID
	// PID allows WorkloadPIDReference, Pod KubernetesObjectReference to pods.
	PID, Pod bool
}

// Config describes a Broker API server. Zero values get the defaults noted.
type Config struct {
	// Socket is the Unix socket's path. Required by Run.
	Socket string
	// Brokers are the allowed brokers; any other peer is refused.
	Brokers []Broker
	// Secrets is the certificate cache. Required.
	Secrets SecretSource
	// Processes finds the pod of a process, as the node socket's callers
	// are found (podresolver: pidfd, cgroup, pod). Required.
	Processes caller.Resolver
	// Pods are the node's pods. Required.
	Pods Pods
	// MaxStreams bounds one broker's open streams. Required.
	MaxStreams int
	// MaxWorkloads bounds the distinct pods one broker holds streams for.
	// Required.
	MaxWorkloads int
	// MaxStreamsSetting and MaxWorkloadsSetting name the settings of the
	// two limits in refusals; empty: the limits are named alone.
	MaxStreamsSetting, MaxWorkloadsSetting string
	// PodWait bounds the wait for a pod referenced by UID that the pod
	// index has not seen yet. Default DefaultPodWait.
	PodWait time.Duration
	// Policy restricts the TLS versions and suites (COMPLIANCE_POLICY).
	Policy tlspolicy.Policy
	// Clock times the bounded-rate refusal log. Nil: the real clock.
	Clock clock.PassiveClock
	// Logger receives the logs. Nil: none.
	Logger *zap.Logger
	// Registerer receives the metrics. Nil: not registered.
	Registerer prometheus.Registerer
}

// Server serves spiffe.broker.API. Create it with New; Run serves it on
// Config.Socket, or Register adds it to a gRPC server of the caller's.
type Server struct {
	brokerpb.UnimplementedAPIServer

	cfg      Config
	log      *zap.Logger
	metrics  *metrics
	allowed  map[spiffeid.ID]Broker
	refusals *refusalLog
	certs    certCache

	streamIDs atomic.Uint64

	mu      sync.Mutex
	brokers map[spiffeid.ID]*brokerCount
	byPod   map[string]map[*workloadStream]struct{}
}

// brokerCount is what one broker holds: its streams, and per pod UID the
// number of its streams for that pod.
type brokerCount struct {
	streams int
	pods    map[string]int
}

// New checks cfg and returns a server. It starts nothing.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Secrets == nil:
		return nil, errors.New("broker API: no secret source")
	case cfg.Processes == nil:
		return nil, errors.New("broker API: no process resolver")
	case cfg.Pods == nil:
		return nil, errors.New("broker API: no pod index")
	}
	if cfg.MaxStreams <= 0 {
		return nil, fmt.Errorf("broker API: Config.MaxStreams %d is not positive", cfg.MaxStreams)
	}
	if cfg.MaxWorkloads <= 0 {
		return nil, fmt.Errorf("broker API: Config.MaxWorkloads %d is not positive", cfg.MaxWorkloads)
	}
	if cfg.PodWait <= 0 {
		cfg.PodWait = DefaultPodWait
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	allowed := make(map[spiffeid.ID]Broker, len(cfg.Brokers))
	for _, b := range cfg.Brokers {
		if b.ID.IsZero() {
			return nil, errors.New("broker API: a broker without a SPIFFE ID")
		}
		if _, dup := allowed[b.ID]; dup {
			return nil, fmt.Errorf("broker API: broker %s listed twice", b.ID)
		}
		allowed[b.ID] = b
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.Named("brokerapi")
	return &Server{
		cfg: cfg, log: log, metrics: m, allowed: allowed,
		refusals: newRefusalLog(log, cfg.Clock),
		brokers:  map[spiffeid.ID]*brokerCount{},
		byPod:    map[string]map[*workloadStream]struct{}{},
	}, nil
}

// Register adds the spiffe.broker.API service to gs, which must be served
// with ServerOptions' credentials (the brokers are known by their TLS
// certificates).
func (s *Server) Register(gs *grpc.Server) {
	brokerpb.RegisterAPIServer(gs, s)
}

// ServerOptions are the options of a gRPC server for the Broker API: mutual
// TLS with X.509-SVIDs (TLSConfig), and small requests.
func (s *Server) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(s.TLSConfig())),
		grpc.MaxRecvMsgSize(maxRecvBytes),
	}
}

// Run serves the API on Config.Socket until ctx ends. The socket is the
// agent's: replaced or removed, it is bound again.
func (s *Server) Run(ctx context.Context) error {
	if s.cfg.Socket == "" {
		return errors.New("broker API: no socket path")
	}
	lis, err := udslisten.Listen(udslisten.Config{
		// Brokers run as any uid; the endpoint's protection is its mutual
		// TLS and the directory being mounted into the brokers' pods alone.
		Path: s.cfg.Socket, DirMode: 0o755, SocketMode: udslisten.DefaultSocketMode,
		Replace: true, Logger: s.log, CheckInterval: 5 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("broker API socket: %w", err)
	}
	defer lis.Close() // removes the socket if it is still ours
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() { watched <- lis.Watch(watchCtx) }()
	defer func() { stopWatch(); <-watched }()

	gs := grpc.NewServer(s.ServerOptions()...)
	s.Register(gs)
	s.log.Info("broker API listening", zap.String(logkeys.Socket, s.cfg.Socket), zap.Int(logkeys.Brokers, len(s.allowed)))
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	gs.Stop()
	if serveErr == nil {
		serveErr = <-served
	}
	if serveErr != nil && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return fmt.Errorf("serving broker API socket %s: %w", s.cfg.Socket, serveErr)
	}
	s.log.Info("broker API stopped", zap.String(logkeys.Socket, s.cfg.Socket))
	return nil
}

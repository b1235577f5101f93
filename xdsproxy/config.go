package xdsproxy

import (
	"math/rand/v2"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/controlplane"
)

// Defaults for Config fields left zero.
const (
	// DefaultMaxMessageSize bounds one ADS message; large meshes push
	// responses of a hundred megabytes and more.
	DefaultMaxMessageSize = 256 << 20
	// DefaultInitialBackoff is the first wait before reconnecting upstream.
	DefaultInitialBackoff = 200 * time.Millisecond
	// DefaultMaxBackoff caps the wait between upstream attempts.
	DefaultMaxBackoff = 30 * time.Second
	// DefaultKeepaliveTime is the idle time after which the upstream
	// connection is pinged (istiod permits pings every 15 s).
	DefaultKeepaliveTime = 30 * time.Second
	// DefaultKeepaliveTimeout is how long a ping may go unanswered before the
	// upstream connection is considered dead.
	DefaultKeepaliveTimeout = 10 * time.Second
)

// PlaintextPort is the discovery port that pilot-agent dials without TLS.
const PlaintextPort = "15010"

// Config describes an xDS proxy. Zero values get the defaults noted.
type Config struct {
	// SocketPath is the Unix socket Envoy (or a proxyless gRPC client)
	// connects to. Its directory is created (0750); a stale socket left there
	// is removed, a live one is an error. The socket is removed on shutdown.
	// Required.
	SocketPath string

	// Upstream says how to reach the control plane:
	//   Addr: the discovery address (PROXY_CONFIG discoveryAddress);
	//   ServerName: the name its certificate must carry (ISTIOD_SAN);
	//   Roots: the xDS root (XDS_ROOT_CA, see docs/operations.md), asked at every handshake;
	//   Token: the bearer token source (the same credfetcher as the CA's);
	//   Metadata: "ClusterID" and one entry per XDS_HEADER_<NAME> variable
	//   (key <NAME>, as pilot-agent strips the prefix);
	//   ClientCertificate: the current workload certificate, offered when the
	//   control plane asks for one and the agent has no bearer token to send
	//   (the token-less VM flow; see docs/istio.md for why not beside a token).
	// An Addr whose port is 15010 is dialed in plaintext, as by pilot-agent,
	// and then the token is sent only if Addr is a loopback address.
	// DialOptions are appended after the proxy's own.
	Upstream controlplane.Config

	// ConnectAfter, when set, holds back the connection made at start until
	// it is closed: the agent closes it once it holds its first workload
	// certificate, so at start-up the handshakes with the CA (on the way to
	// the first certificate, which Envoy needs) do not share the CPU with
	// the control plane's, and an upstream that asks for the workload
	// certificate finds it. A client stream opened earlier connects at once.
	// Nil: connect when Run starts.
	ConnectAfter <-chan struct{}

	// Subscriptions are the proxy's own subscriptions, sent on every
	// upstream stream after the client's first request (see Subscription).
	// Each TypeURL once.
	Subscriptions []Subscription

	// MaxMessageSize bounds one message in either direction.
	// Default DefaultMaxMessageSize.
	MaxMessageSize int

	// InitialBackoff and MaxBackoff bound the jittered, doubling wait between
	// upstream attempts after a failure. Defaults DefaultInitialBackoff and
	// DefaultMaxBackoff.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration

	// KeepaliveTime and KeepaliveTimeout set the upstream connection's
	// HTTP/2 pings. Defaults DefaultKeepaliveTime and DefaultKeepaliveTimeout.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration

	// Clock times the backoff. Default the real clock.
	Clock clock.Clock
	// Rand returns uniform jitter draws in [0, 1); it is called from many
	// goroutines. Default math/rand/v2.Float64.
	Rand func() float64

	// Logger receives the proxy's logs. Default zap.NewNop().
	Logger *zap.Logger
	// Registerer, when set, registers the proxy's metrics.
	Registerer prometheus.Registerer
}

func (cfg Config) withDefaults() Config {
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = DefaultMaxMessageSize
	}
	if cfg.InitialBackoff <= 0 {
		cfg.InitialBackoff = DefaultInitialBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.InitialBackoff)
	if cfg.KeepaliveTime <= 0 {
		cfg.KeepaliveTime = DefaultKeepaliveTime
	}
	if cfg.KeepaliveTimeout <= 0 {
		cfg.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if _, port, err := net.SplitHostPort(cfg.Upstream.Addr); err == nil && port == PlaintextPort {
		cfg.Upstream.Plaintext = true
	}
	return cfg
}

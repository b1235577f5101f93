package linkerd

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/caclient/linkerd/identitypb"
	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
)

// DefaultTimeout bounds one Certify call unless Config.Timeout says otherwise.
const DefaultTimeout = 30 * time.Second

// Config describes a Linkerd identity client. Zero values get the defaults
// noted on each field.
type Config struct {
	// Transport says how to reach the identity service: Addr (CA_ADDR), Roots
	// (the trust anchors), extra Metadata and DialOptions.
	// Transport.ServerName is the name the service must present
	// (MESHAGENT_LINKERD_IDENTITY_SERVICE_NAME); empty means
	// Scheme.CAServerName(). Transport.Token
	// is never sent as metadata: the token goes in the request body, so
	// Transport.Token is used as Token when Token is nil and then cleared.
	// Plaintext is accepted only for a loopback Addr.
	Transport controlplane.Config
	// Scheme is the Linkerd identity scheme (trust domain and control-plane
	// namespace), used only for the default server name. The zero Scheme
	// means pki.LinkerdScheme(pki.DefaultTrustDomain, "").
	Scheme pki.Scheme
	// Token gives the proof of identity (the projected service-account token,
	// audience identity.l5d.io), read afresh for every call. Required.
	Token credfetcher.Fetcher
	// TokenFor, when set, chooses the token source per identity and Token
	// is not used: an agent certifying identities of other workloads (node
	// mode) sends each identity's own service-account token, since the
	// identity service checks that the token's account is the identity's.
	// A refusal is reported to the source TokenFor returned.
	TokenFor func(id pki.Identity) (credfetcher.Fetcher, error)
	// Timeout bounds one Certify call when the caller's context allows more.
	// Default 30s.
	Timeout time.Duration
	// Logger; nil means no logging.
	Logger *zap.Logger
	// Registerer receives the client's metrics; nil registers them nowhere.
	Registerer prometheus.Registerer
}

// Client is a caclient.Client for Identity.Certify.
type Client struct {
	transport  controlplane.Config
	serverName string
	// plaintextLoopback: a plaintext transport to a loopback address, where
	// the token may go without a TLS peer.
	plaintextLoopback bool
	token             credfetcher.Fetcher
	tokenFor          func(pki.Identity) (credfetcher.Fetcher, error)
	timeout           time.Duration
	log               *zap.Logger
	metrics           *metrics

	conn *caclient.Conn
}

var (
	_ caclient.Client       = (*Client)(nil)
	_ caclient.Preconnecter = (*Client)(nil)
)

// New checks cfg and returns a client. It does not connect.
func New(cfg Config) (*Client, error) {
	if cfg.Transport.Addr == "" {
		return nil, errors.New("linkerd identity client: no address")
	}
	if cfg.Token == nil {
		cfg.Token = cfg.Transport.Token
	}
	cfg.Transport.Token = nil
	if cfg.Token == nil && cfg.TokenFor == nil {
		return nil, errors.New("linkerd identity client: no token source")
	}
	loopback := controlplane.IsLoopback(cfg.Transport.Addr)
	if cfg.Transport.Plaintext && !loopback {
		return nil, fmt.Errorf("linkerd identity client: plaintext to %s would never carry the token: only loopback addresses may be plaintext", cfg.Transport.Addr)
	}
	if cfg.Scheme.IsZero() {
		cfg.Scheme, _ = pki.LinkerdScheme(pki.DefaultTrustDomain, "")
	}
	if !cfg.Scheme.IsLinkerd() {
		return nil, fmt.Errorf("linkerd identity client: scheme %s is not Linkerd's", cfg.Scheme)
	}
	if cfg.Transport.ServerName == "" {
		cfg.Transport.ServerName = cfg.Scheme.CAServerName()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("linkerd identity client: %w", err)
	}
	return &Client{
		transport:         cfg.Transport,
		serverName:        cfg.Transport.ServerName,
		plaintextLoopback: cfg.Transport.Plaintext && loopback,
		token:             cfg.Token,
		tokenFor:          cfg.TokenFor,
		timeout:           cfg.Timeout,
		log: cfg.Logger.Named("linkerd").With(
			zap.String(logkeys.CAAddr, cfg.Transport.Addr),
			zap.String(logkeys.ServerName, cfg.Transport.ServerName)),
		metrics: m,
		conn:    caclient.NewConn(cfg.Transport, ErrClosed),
	}, nil
}

// ServerName returns the TLS name the identity service must present.
func (c *Client) ServerName() string { return c.serverName }

// Sign asks the identity service to certify csr (DER; PEM is converted) for
// id, which must be a DNS-like identity. ttl is ignored: the protocol has no
// lifetime field. The token is read from the token source and sent only to a
// verified peer (see the package doc). The answer is parsed but not judged:
// the caller checks it with pki.VerifyIssued.
//
// Errors keep the gRPC status in their chain (status.Code works on them). A refusal to send the token
// wraps controlplane.ErrUnverifiedPeer; a bad answer wraps ErrMalformedAnswer.
func (c *Client) Sign(ctx context.Context, csr []byte, id pki.Identity, _ time.Duration) ([]*x509.Certificate, error) {
	if id.DNSName == "" {
		return nil, fmt.Errorf("%w: got %q", ErrNotDNSIdentity, id.String())
	}
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("certifying %s: %w", id, err)
	}
	log := c.log.With(zap.String(logkeys.Identity, id.DNSName))

	source := c.token
	if c.tokenFor != nil {
		var err error
		if source, err = c.tokenFor(id); err != nil {
			c.metrics.requests.WithLabelValues(outcomeTokenError).Inc()
			return nil, fmt.Errorf("certifying %s: no token source: %w", id, err)
		}
	}
	tok, err := source.Token(ctx)
	if err != nil {
		c.metrics.requests.WithLabelValues(outcomeTokenError).Inc()
		return nil, fmt.Errorf("certifying %s: fetching token: %w", id, err)
	}
	conn, err := c.conn.Get()
	if err != nil {
		if errors.Is(err, ErrClosed) {
			c.metrics.requests.WithLabelValues(outcomeClosed).Inc()
		} else {
			c.metrics.requests.WithLabelValues(outcomeDialError).Inc()
		}
		return nil, fmt.Errorf("certifying %s: %w", id, err)
	}

	req := &identitypb.CertifyRequest{Identity: id.DNSName, CertificateSigningRequest: csrDER(csr)}
	gate := &tokenGate{serverName: c.serverName, plaintextLoopback: c.plaintextLoopback, token: []byte(tok), req: req}
	callCtx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	resp, err := identitypb.NewIdentityClient(conn).Certify(callCtx, req, grpc.PerRPCCredentials(gate))
	latency := time.Since(start)
	if err != nil {
		if refusal := gate.refused(); refusal != nil {
			c.conn.Retire(conn, refusal)
			c.metrics.requests.WithLabelValues(outcomeUnverifiedPeer).Inc()
			log.Error("token withheld from unverified identity service", zap.Error(refusal))
			return nil, fmt.Errorf("certifying %s at %s: %w", id, c.transport.Addr, refusal)
		}
		c.conn.Retire(conn, err)
		code := status.Code(err)
		if tokenRefused(code) {
			credfetcher.Refused(source, tok)
		}
		c.metrics.requests.WithLabelValues(code.String()).Inc()
		c.metrics.latency.Observe(latency.Seconds())
		log.Warn("certify call failed", zap.Stringer(logkeys.Code, code), zap.Duration(logkeys.Latency, latency), zap.Error(err))
		return nil, fmt.Errorf("certifying %s at %s: %w", id, c.transport.Addr, err)
	}
	c.metrics.latency.Observe(latency.Seconds())

	chain, err := parseAnswer(resp)
	if err != nil {
		c.metrics.requests.WithLabelValues(outcomeMalformed).Inc()
		log.Warn("identity service answered a malformed chain", zap.Error(err))
		return nil, fmt.Errorf("certifying %s at %s: %w", id, c.transport.Addr, err)
	}
	c.metrics.requests.WithLabelValues("OK").Inc()
	leaf := chain[0]
	if reason, vu := checkValidUntil(resp, leaf); reason != "" {
		c.metrics.warnings.WithLabelValues(reason).Inc()
		log.Warn("answer's valid_until disagrees with the leaf certificate; using the leaf's expiry",
			zap.String(logkeys.Reason, reason), zap.Time(logkeys.ValidUntil, vu), zap.Time(logkeys.NotAfter, leaf.NotAfter))
	}
	log.Debug("identity service certified identity",
		zap.Time(logkeys.NotAfter, leaf.NotAfter), zap.Int(logkeys.Certs, len(chain)), zap.Duration(logkeys.Latency, latency))
	return chain, nil
}

// Close drops the connection. It is safe to call twice.
func (c *Client) Close() error {
	if err := c.conn.Close(); err != nil {
		return fmt.Errorf("closing connection to %s: %w", c.transport.Addr, err)
	}
	return nil
}

// Preconnect starts the connection to the identity service in the
// background, so the first Sign finds the handshakes done or under way. A
// failure is left to Sign.
func (c *Client) Preconnect() { c.conn.Preconnect() }

// csrDER returns the DER form of a CSR given in DER or PEM.
func csrDER(csr []byte) []byte {
	if block, _ := pem.Decode(csr); block != nil {
		return block.Bytes
	}
	return csr
}

// tokenRefused reports whether an answer with code may mean the token was
// refused: the identity service answers FailedPrecondition when the token
// does not authenticate and InvalidArgument when it does not parse (both
// also cover CSR faults; a needless new token costs one request).
func tokenRefused(code codes.Code) bool {
	switch code {
	case codes.Unauthenticated, codes.FailedPrecondition, codes.InvalidArgument:
		return true
	}
	return false
}

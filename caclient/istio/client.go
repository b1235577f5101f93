package istio

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
)

// PlaintextPortNumber is the port on which pilot-agent talks to the control
// plane without TLS.
const PlaintextPortNumber = "15010"

// CertSignerKey is the request metadata key naming the signer
// (ISTIO_META_CERT_SIGNER).
const CertSignerKey = "CertSigner"

// ImpersonatedIdentityKey is the request metadata key with which a node
// agent asks for the certificate of another identity than its token's
// (istiod's node authorizer, CA_TRUSTED_NODE_ACCOUNTS).
const ImpersonatedIdentityKey = "ImpersonatedIdentity"

// DefaultAttemptTimeout is the default bound of one CreateCertificate call.
const DefaultAttemptTimeout = 30 * time.Second

var (
	// ErrClosed is returned by Sign after Close.
	ErrClosed = errors.New("istio CA client is closed")
	// ErrBadAnswer is wrapped by errors for an answer whose chain does not parse.
	ErrBadAnswer = errors.New("CA answered a certificate chain that does not parse")
)

// Config describes an Istio CA client. Zero values get the defaults noted.
type Config struct {
	// Transport says how to reach the CA: address, TLS server name (ISTIOD_SAN)
	// and roots, plaintext (port 15010, see PlaintextPort), the PROV_CERT client
	// certificate, the bearer token fetcher, and the extra gRPC metadata
	// (ClusterID and the CA_HEADER_* values). Addr is required.
	Transport controlplane.Config
	// CertSigner (ISTIO_META_CERT_SIGNER), when set, is sent as the
	// "CertSigner" field of the request metadata.
	CertSigner string
	// Identity, when set, is the identity the bearer token (or client
	// certificate) authenticates: the agent's own, in node mode. A Sign for
	// any other identity names it in the ImpersonatedIdentity metadata
	// field, and the CA issues it only to a trusted node account for an
	// identity with a pod on the agent's node. Unset (one workload per
	// agent), nothing is impersonated: the CA takes the identity from the
	// token.
	Identity pki.Identity
	// AttemptTimeout bounds one call, within the caller's context. Default
	// 30s; a negative value means no bound of its own.
	AttemptTimeout time.Duration
	// Logger receives the client's logs. Nil means no logs.
	Logger *zap.Logger
	// Registerer receives the metrics. Nil means they are not registered.
	Registerer prometheus.Registerer
}

// Client signs CSRs with an Istio CA. Create it with New.
type Client struct {
	cfg     Config
	log     *zap.Logger
	metrics *metrics
	conn    *caclient.Conn
}

var (
	_ caclient.Client       = (*Client)(nil)
	_ caclient.Preconnecter = (*Client)(nil)
)

// New checks cfg and returns a client. It does not connect: the connection is
// made on the first Sign.
func New(cfg Config) (*Client, error) {
	tc := cfg.Transport
	if tc.Addr == "" {
		return nil, errors.New("istio CA client: no CA address")
	}
	if tc.Plaintext && tc.Token != nil && !controlplane.IsLoopback(tc.Addr) {
		return nil, fmt.Errorf("istio CA client: plaintext connection to %s: %w", tc.Addr, controlplane.ErrUnverifiedPeer)
	}
	switch {
	case cfg.AttemptTimeout == 0:
		cfg.AttemptTimeout = DefaultAttemptTimeout
	case cfg.AttemptTimeout < 0:
		cfg.AttemptTimeout = 0
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("istio CA client: %w", err)
	}
	return &Client{
		cfg:     cfg,
		log:     cfg.Logger.Named("caclient.istio").With(zap.String(logkeys.CAAddr, tc.Addr)),
		metrics: m,
		conn:    caclient.NewConn(tc, ErrClosed),
	}, nil
}

// PlaintextPort reports whether addr (host:port) uses the port on which
// pilot-agent talks without TLS (15010). The caller decides what to do with it.
func PlaintextPort(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && port == PlaintextPortNumber
}

// Sign sends the DER csr to the CA asking for ttl and returns the parsed
// chain, leaf first. It makes exactly one CreateCertificate call: retrying is
// the caller's business (the secret manager's per-identity backoff), so a CA
// under load never sees retries stacked on retries. After a call that failed
// in the transport the connection is dropped, so the next Sign dials afresh
// (as pilot-agent rebuilds its channel) instead of waiting out gRPC's
// reconnect backoff; a status the CA answered keeps it, so other identities'
// calls in flight on it go on. An
// error wraps the gRPC status (status.Code works on it) or ErrBadAnswer. The
// chain is not judged here: check it with pki.VerifyIssued.
func (c *Client) Sign(ctx context.Context, csr []byte, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	req := &pb.IstioCertificateRequest{
		Csr:              string(pki.EncodeCSRPEM(csr)),
		ValidityDuration: int64(ttl / time.Second),
	}
	fields := map[string]*structpb.Value{}
	if c.cfg.CertSigner != "" {
		fields[CertSignerKey] = structpb.NewStringValue(c.cfg.CertSigner)
	}
	impersonate := c.impersonates(id)
	if impersonate {
		fields[ImpersonatedIdentityKey] = structpb.NewStringValue(id.SPIFFEID)
	}
	if len(fields) > 0 {
		req.Metadata = &structpb.Struct{Fields: fields}
	}
	chain, err := c.attempt(ctx, req)
	if impersonate {
		c.metrics.impersonated.WithLabelValues(impersonationResult(err)).Inc()
	}
	if err != nil {
		if cerr := contextEnded(ctx); cerr != nil {
			return nil, fmt.Errorf("signing certificate for %s: %w: %w", id, cerr, err)
		}
		c.log.Warn("CA request failed", zap.String(logkeys.Identity, id.String()), zap.Bool(logkeys.Impersonated, impersonate),
			zap.Stringer(logkeys.Code, status.Code(err)), zap.Error(err))
		if impersonate && status.Code(err) == codes.Unauthenticated {
			return nil, fmt.Errorf("signing certificate for %s on behalf of %s: the CA refused the impersonation "+
				"(is the agent's service account in the CA's trusted node accounts, and does a pod of %s run on this node?): %w",
				id, c.cfg.Identity, id, err)
		}
		return nil, fmt.Errorf("signing certificate for %s: %w", id, err)
	}
	c.log.Debug("certificate signed", zap.String(logkeys.Identity, id.String()), zap.Int(logkeys.Certs, len(chain)), zap.Duration(logkeys.TTL, ttl))
	return chain, nil
}

// impersonates reports whether a certificate for id is asked on behalf of
// another identity than the token's.
func (c *Client) impersonates(id pki.Identity) bool {
	return c.cfg.Identity.SPIFFEID != "" && id.SPIFFEID != "" && id.SPIFFEID != c.cfg.Identity.SPIFFEID
}

// impersonationResult labels the outcome of an impersonated request.
func impersonationResult(err error) string {
	switch {
	case err == nil:
		return resultOK
	case status.Code(err) == codes.Unauthenticated || status.Code(err) == codes.PermissionDenied:
		return resultRefused
	default:
		return resultFailed
	}
}

// contextEnded returns ctx's error, or DeadlineExceeded once its deadline has
// passed (the server may end the call on the propagated deadline a moment
// before ctx itself is done).
func contextEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// attempt makes one CreateCertificate call.
func (c *Client) attempt(ctx context.Context, req *pb.IstioCertificateRequest) ([]*x509.Certificate, error) {
	conn, err := c.conn.Get()
	if err != nil {
		return nil, err
	}
	if c.cfg.AttemptTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		defer cancel()
	}
	start := time.Now()
	resp, err := pb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, req)
	c.metrics.latency.Observe(time.Since(start).Seconds())
	if err != nil {
		// Dial afresh next time when the transport failed, as pilot-agent
		// rebuilds its channel; an answer from the CA keeps the connection.
		c.conn.Retire(conn, err)
		c.metrics.requests.WithLabelValues(codeLabel(status.Code(err))).Inc()
		return nil, fmt.Errorf("CreateCertificate: %w", err)
	}
	chain, err := ParseCertChain(resp.GetCertChain())
	if err != nil {
		c.metrics.requests.WithLabelValues(resultBadAnswer).Inc()
		return nil, err
	}
	c.metrics.requests.WithLabelValues(resultOK).Inc()
	return chain, nil
}

// Preconnect starts the connection to the CA in the background, so the first
// Sign finds the handshakes done or under way. A failure is left to Sign.
func (c *Client) Preconnect() { c.conn.Preconnect() }

// Close releases the connection. It is safe to call twice.
func (c *Client) Close() error { return c.conn.Close() }

// ParseCertChain parses the cert_chain of an answer: PEM strings, leaf first.
// A string may hold several certificates (some CAs answer the whole chain in
// one string); they are taken in order. Anything that is not a clean PEM
// certificate bundle, or an empty chain, is an error wrapping ErrBadAnswer.
func ParseCertChain(chain []string) ([]*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, fmt.Errorf("%w: %w", ErrBadAnswer, pki.ErrNoCertificates)
	}
	var out []*x509.Certificate
	for i, s := range chain {
		certs, err := pki.ParseCertificates([]byte(s))
		if err != nil {
			return nil, fmt.Errorf("%w: cert_chain[%d]: %w", ErrBadAnswer, i, err)
		}
		out = append(out, certs...)
	}
	return out, nil
}

package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/tlspolicy"
)

// ErrUnverifiedPeer is returned instead of sending a token to a peer whose
// identity was not verified.
var ErrUnverifiedPeer = errors.New("refusing to send a bearer token to an unverified peer")

// RootSource returns the trust roots in force now. It is asked at every TLS
// handshake, so a root rotation applies to the next connection.
type RootSource interface {
	Roots() *x509.CertPool
}

// StaticRoots is a RootSource that never changes.
type StaticRoots struct{ Pool *x509.CertPool }

// Roots returns the pool.
func (s StaticRoots) Roots() *x509.CertPool { return s.Pool }

// Config describes how to reach a control-plane service: the CA or the
// discovery server.
type Config struct {
	// Addr is host:port.
	Addr string
	// ServerName is the name the peer's certificate must carry (ISTIOD_SAN,
	// the Linkerd identity service name). Default: the host of Addr.
	ServerName string
	// Roots verifies the peer. Nil means the system roots.
	Roots RootSource
	// Plaintext disables TLS (pilot-agent's port 15010). A token is then sent
	// only when Addr is a loopback address.
	Plaintext bool
	// ClientCertificate, when set, is offered to a peer that asks for one and
	// accepts its issuer; it is called at every handshake so a rotated
	// certificate is used at once. A peer that names the CAs it accepts
	// (istiod names the roots it started with) and names none of the
	// certificate's chain is offered nothing: the certificate would fail the
	// handshake, where without it a bearer token can still authenticate the
	// caller. A peer names CAs by subject only, so a root rotated to one
	// with the old root's subject passes that test: when the peer refuses
	// the certificate offered (a TLS alert about it, or the connection
	// dropped before the peer sent anything), the next handshake offers
	// none if Token gives a token, and the one after offers it again.
	ClientCertificate func() (*tls.Certificate, error)
	// Token, when set, is sent as "authorization: Bearer <token>".
	Token credfetcher.Fetcher
	// TokenOptional lets a call go out without a token when the fetcher has
	// none (credfetcher.ErrNoToken): the VM flow, where the client certificate
	// from PROV_CERT authenticates the caller.
	TokenOptional bool
	// Metadata is sent with every call (ClusterID, CA_HEADER_*, XDS_HEADER_*).
	Metadata map[string]string
	// DialOptions are appended to the options Dial builds.
	DialOptions []grpc.DialOption
	// Policy restricts the TLS versions, suites and key exchanges
	// (COMPLIANCE_POLICY). Empty leaves Go's defaults.
	Policy tlspolicy.Policy

	// refusals is shared by the connections dialled with this
	// configuration (NewConn sets it, so a redial after a failure sees the
	// refusal); TLSConfig makes one of its own when it is nil.
	refusals *certRefusals
}

// certRefusals remembers that the peer refused the client certificate
// offered at a handshake, so that the next handshake offers none when a
// bearer token can speak instead.
type certRefusals struct{ skipNext atomic.Bool }

// SharingRefusals returns cfg with the record of refused client
// certificates that every connection dialled with the result shares, so a
// redial after a refusal sees it.
func (cfg Config) SharingRefusals() Config {
	cfg.refusals = cfg.refusalsOrNew()
	return cfg
}

// serverName returns cfg.ServerName, or the host part of cfg.Addr.
func (cfg Config) serverName() string {
	if cfg.ServerName != "" {
		return cfg.ServerName
	}
	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return cfg.Addr
	}
	return host
}

// TLSConfig returns the client TLS configuration Dial uses: the peer chain is
// verified against cfg.Roots at handshake time and must name the server
// name (cfg.ServerName, else the host of cfg.Addr).
func (cfg Config) TLSConfig() *tls.Config {
	return cfg.tlsConfig(cfg.refusalsOrNew())
}

func (cfg Config) refusalsOrNew() *certRefusals {
	if cfg.refusals != nil {
		return cfg.refusals
	}
	return &certRefusals{}
}

// tlsConfig is TLSConfig with the refusals its client certificate choice
// reads.
func (cfg Config) tlsConfig(refusals *certRefusals) *tls.Config {
	name := cfg.serverName()
	roots := cfg.Roots
	tc := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: name,
		// Verification is done in VerifyConnection so the roots can change
		// between handshakes without rebuilding the connection.
		InsecureSkipVerify: true, //nolint:gosec // verified below
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPeer(cs, roots, name)
		},
	}
	tlspolicy.Apply(tc, cfg.Policy)
	if cfg.ClientCertificate != nil {
		get, tokens := cfg.ClientCertificate, cfg.Token
		tc.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := get()
			if err != nil || c == nil {
				// No certificate yet: offer none and let the peer decide.
				return &tls.Certificate{}, nil
			}
			if len(cri.AcceptableCAs) > 0 && cri.SupportsCertificate(c) != nil {
				// Issued under a root the peer does not know (a root rotated
				// since istiod started): offer none and let the token speak.
				return &tls.Certificate{}, nil
			}
			if refusals.skipNext.Swap(false) && hasToken(cri.Context(), tokens) {
				// The peer refused it at the last handshake although it
				// names its issuer (a rotated root with the old one's
				// subject): this once, the token alone.
				return &tls.Certificate{}, nil
			}
			return c, nil
		}
	}
	return tc
}

func verifyPeer(cs tls.ConnectionState, roots RootSource, name string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("peer presented no certificate")
	}
	var pool *x509.CertPool
	if roots != nil {
		pool = roots.Roots()
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots:         pool,
		Intermediates: inter,
		DNSName:       name,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("verifying peer %q: %w", name, err)
	}
	return nil
}

// Dial builds a gRPC client connection for cfg. Like grpc.NewClient it does
// not connect until the first call.
func Dial(cfg Config) (*grpc.ClientConn, error) {
	if cfg.Addr == "" {
		return nil, errors.New("no address to dial")
	}
	var opts []grpc.DialOption
	if cfg.Plaintext {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		refusals := cfg.refusalsOrNew()
		tc := cfg.tlsConfig(refusals)
		creds := credentials.NewTLS(tc)
		if cfg.ClientCertificate != nil {
			creds = &refusalWatch{TransportCredentials: creds, tc: tc, refusals: refusals}
		}
		opts = append(opts, grpc.WithTransportCredentials(creds))
	}
	if cfg.Token != nil || len(cfg.Metadata) > 0 {
		cc := &callCreds{
			token:    cfg.Token,
			optional: cfg.TokenOptional,
			md:       cfg.Metadata,
			loopback: IsLoopback(cfg.Addr),
		}
		opts = append(opts, grpc.WithPerRPCCredentials(cc))
		if _, ok := cfg.Token.(credfetcher.Invalidator); ok {
			opts = append(opts,
				grpc.WithChainUnaryInterceptor(cc.unaryRefusals),
				grpc.WithChainStreamInterceptor(cc.streamRefusals))
		}
	}
	opts = append(opts, cfg.DialOptions...)
	conn, err := grpc.NewClient(target(cfg.Addr), opts...)
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", cfg.Addr, err)
	}
	return conn, nil
}

func target(addr string) string {
	if strings.Contains(addr, "://") {
		return addr
	}
	return "passthrough:///" + addr
}

// IsLoopback reports whether addr (host:port, a unix socket, or a host) names
// this machine: a loopback IP, "localhost", or a Unix socket.
func IsLoopback(addr string) bool {
	if strings.HasPrefix(addr, "unix:") || strings.HasPrefix(addr, "/") {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// callCreds attaches the token and the extra metadata to every call, refusing
// to attach the token when the connection's peer was not verified by TLS and
// is not on loopback.
type callCreds struct {
	token    credfetcher.Fetcher
	optional bool
	md       map[string]string
	loopback bool
	// sent is the last token attached to a call; a call refused with
	// Unauthenticated reports it to the fetcher (credfetcher.Refused).
	sent atomic.Pointer[string]
}

func (c *callCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	out := make(map[string]string, len(c.md)+1)
	for k, v := range c.md {
		out[strings.ToLower(k)] = v
	}
	if c.token == nil {
		return out, nil
	}
	ri, _ := credentials.RequestInfoFromContext(ctx)
	if _, verified := ri.AuthInfo.(credentials.TLSInfo); !verified && !c.loopback {
		return nil, ErrUnverifiedPeer
	}
	tok, err := c.token.Token(ctx)
	if errors.Is(err, credfetcher.ErrNoToken) && c.optional {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fetching token: %w", err)
	}
	out["authorization"] = "Bearer " + tok
	c.sent.Store(&tok)
	return out, nil
}

// refused reports the last token sent when err says the peer refused it.
// Calls on one connection share a token except across a refresh, when the
// report names a token the fetcher has already replaced and changes nothing.
func (c *callCreds) refused(err error) {
	if status.Code(err) != codes.Unauthenticated {
		return
	}
	if tok := c.sent.Load(); tok != nil {
		credfetcher.Refused(c.token, *tok)
	}
}

func (c *callCreds) unaryRefusals(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	c.refused(err)
	return err
}

func (c *callCreds) streamRefusals(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		c.refused(err)
		return nil, err
	}
	return &refusalStream{ClientStream: s, creds: c}, nil
}

// refusalStream watches a stream's receive errors for Unauthenticated (a
// control plane refuses the token when the stream starts, on RecvMsg).
type refusalStream struct {
	grpc.ClientStream
	creds *callCreds
}

func (s *refusalStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.creds.refused(err)
	}
	return err
}

// RequireTransportSecurity is false: the rule above is stricter than gRPC's
// (it allows loopback plaintext, as pilot-agent does on port 15010, and
// nothing else).
func (c *callCreds) RequireTransportSecurity() bool { return false }

// hasToken says whether tokens gives a token now.
func hasToken(ctx context.Context, tokens credfetcher.Fetcher) bool {
	if tokens == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	t, err := tokens.Token(ctx)
	return err == nil && t != ""
}

// refusalWatch notes a handshake whose client certificate the peer refused.
// Go's server refuses a certificate it cannot verify with a TLS alert, which
// a TLS 1.2 client reads during the handshake and a TLS 1.3 client only on
// its first read after it (the client's part of the handshake is over when
// it sends its certificate).
type refusalWatch struct {
	credentials.TransportCredentials
	tc       *tls.Config
	refusals *certRefusals
}

func (w *refusalWatch) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	// This handshake's own configuration, to know whether it offered the
	// certificate.
	offered := &atomic.Bool{}
	tc := w.tc.Clone()
	get := tc.GetClientCertificate
	tc.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		c, err := get(cri)
		offered.Store(err == nil && c != nil && len(c.Certificate) > 0)
		return c, err
	}
	conn, info, err := credentials.NewTLS(tc).ClientHandshake(ctx, authority, raw)
	if err != nil {
		w.note(offered, err)
		return nil, nil, err
	}
	return &watchedConn{Conn: conn, note: func(err error) { w.note(offered, err) }}, info, nil
}

func (w *refusalWatch) Clone() credentials.TransportCredentials {
	return &refusalWatch{TransportCredentials: w.TransportCredentials.Clone(), tc: w.tc, refusals: w.refusals}
}

func (w *refusalWatch) note(offered *atomic.Bool, err error) {
	if offered.Load() && certificateAlert(err) {
		w.refusals.skipNext.Store(true)
	}
}

// certificateAlert says whether err, on a connection the peer has sent
// nothing on since the handshake, is its refusal of the certificate: a TLS
// alert about it (bad, unsupported, revoked, expired or unknown certificate,
// unknown certificate authority; crypto/tls reports a received alert as a
// *net.OpError "remote error" with the alert's text), or the connection
// reset or closed under a write, which is how the alert's arrival looks when
// the client was writing its first frames as the peer closed.
func certificateAlert(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && op.Err != nil {
		return strings.Contains(op.Err.Error(), "certificate")
	}
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// watchedConn passes the errors of its reads and writes to note until a
// read has succeeded: the peer's refusal of the certificate comes, if at
// all, before anything else.
type watchedConn struct {
	net.Conn
	note   func(error)
	passed atomic.Bool
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if !c.passed.Load() {
		if err != nil {
			c.note(err)
		}
		if n > 0 {
			c.passed.Store(true)
		}
	}
	return n, err
}

func (c *watchedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil && !c.passed.Load() {
		c.note(err)
	}
	return n, err
}

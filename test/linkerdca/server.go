package linkerdca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"

	"github.com/meshagent/meshagent/caclient/linkerd/identitypb"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/testca"
)

// Defaults.
const (
	// DefaultControlPlaneNamespace is the namespace in the default names.
	DefaultControlPlaneNamespace = "linkerd"
	// DefaultTrustDomain is the trust domain in the default names.
	DefaultTrustDomain = "cluster.local"
	// DefaultServerName is the DNS SAN of the default serving certificate,
	// the name Linkerd's identity service presents.
	DefaultServerName = "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"
	// DefaultLifetime of issued certificates, as Linkerd's.
	DefaultLifetime = 24 * time.Hour
	// ClockSkew is subtracted from NotBefore, as Linkerd does.
	ClockSkew = 20 * time.Second
)

// Mode says how the server answers a request it accepted. The bad answers are
// what a broken or hostile identity service could return to an authenticated
// caller.
type Mode int

// The answer modes.
const (
	// ModeOK issues a correct certificate.
	ModeOK Mode = iota
	// ModeWrongIdentity issues a certificate for another identity.
	ModeWrongIdentity
	// ModeExpired issues a certificate that has already expired.
	ModeExpired
	// ModeWrongKey issues a certificate for a key other than the CSR's.
	ModeWrongKey
	// ModeForeignChain issues from a CA whose root the client does not trust.
	ModeForeignChain
	// ModeGarbage answers a leaf that is not DER.
	ModeGarbage
	// ModeNoValidUntil leaves valid_until out of a correct answer.
	ModeNoValidUntil
	// ModeValidUntilMismatch sets valid_until an hour after the leaf's NotAfter.
	ModeValidUntilMismatch
	// ModePEM answers the chain in PEM instead of DER, as a mistaken server
	// might, following the proto's comments.
	ModePEM
)

var modeNames = [...]string{"ok", "wrong-identity", "expired", "wrong-key", "foreign-chain", "garbage", "no-valid-until", "valid-until-mismatch", "pem"}

// String names the mode.
func (m Mode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Config describes a test identity service. Zero values get the defaults noted.
type Config struct {
	// Tokens maps a token to the identity it proves (a DNS-like name, see
	// Identity).
	Tokens map[string]string
	// CA is the trust anchor and issuer. Nil means a fresh localca with an
	// intermediate (the issuer) under the root (the trust anchor).
	CA *localca.CA
	// ServerNames are the DNS SANs of the serving certificate. Default
	// [DefaultServerName].
	ServerNames []string
	// Addr to listen on. Default "127.0.0.1:0".
	Addr string
	// Now is the clock for issued certificates. Default time.Now. The serving
	// certificate always uses the real time, since TLS peers check it so.
	Now func() time.Time
	// Lifetime of issued certificates. Default DefaultLifetime.
	Lifetime time.Duration
	// NotReady starts with the issuer not ready (Unavailable) until SetReady.
	NotReady bool
	// Plaintext serves without TLS.
	Plaintext bool
	// TokenReviews, when set, authenticates tokens that are not in the
	// token table as Linkerd's identity service does: a TokenReview with
	// audience identity.l5d.io against this API server, whose answer must
	// be an authenticated service account
	// (system:serviceaccount:<ns>:<sa>); the token then proves the identity
	// of that account under ControlPlaneNamespace and TrustDomain. Every
	// review is recorded (Reviews).
	TokenReviews authnv1client.TokenReviewInterface
	// ControlPlaneNamespace and TrustDomain name the identities reviewed
	// tokens prove. Defaults DefaultControlPlaneNamespace and
	// DefaultTrustDomain.
	ControlPlaneNamespace, TrustDomain string
}

// Audience is the audience the identity service asks TokenReview for.
const Audience = "identity.l5d.io"

// Review is one TokenReview the server made and what it concluded.
type Review struct {
	// Identity is the identity requested with the token.
	Identity string
	// Authenticated is the API server's answer.
	Authenticated bool
	// Username is the reviewed user (system:serviceaccount:<ns>:<sa>).
	Username string
	// PodName and PodUID are the pod the token is bound to, if any.
	PodName, PodUID string
	// Err is the review's failure or the API server's error text.
	Err string
}

// Request is what one Certify call carried, and how it was answered.
type Request struct {
	Identity string
	Token    string
	CSR      []byte
	// Authorization is the "authorization" gRPC metadata, if any: Linkerd
	// reads the token from the body, so a client should send none.
	Authorization string
	// Code is the status the call was answered with (OK when a certificate
	// was issued); Unknown while the call is still being handled.
	Code codes.Code
}

// Server is a running test identity service. Its Endpoint serves it: Addr,
// ServerName, RootPEM, Roots, CA, Stop, Restart, ServingCert,
// SetServingCert and SetDelay.
type Server struct {
	*testca.Endpoint
	cfg Config
	ca  *localca.CA

	mu       sync.Mutex
	tokens   map[string]string
	rejected map[string]bool
	ready    bool
	mode     Mode
	lifetime time.Duration
	requests []Request
	reviews  []Review
}

// Start serves a new test identity service and stops it when the test ends.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	s, err := newServer(cfg)
	if err != nil {
		t.Fatalf("linkerdca: %v", err)
	}
	s.Endpoint = testca.Serve(t, testca.Config{
		Name: "linkerdca", CA: s.ca, ServerNames: s.cfg.ServerNames, Addr: s.cfg.Addr,
		Plaintext: s.cfg.Plaintext, Now: s.cfg.Now,
		Register: func(g *grpc.Server) { identitypb.RegisterIdentityServer(g, &handler{s: s}) },
	})
	return s
}

func newServer(cfg Config) (*Server, error) {
	if len(cfg.ServerNames) == 0 {
		cfg.ServerNames = []string{DefaultServerName}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Lifetime <= 0 {
		cfg.Lifetime = DefaultLifetime
	}
	if cfg.ControlPlaneNamespace == "" {
		cfg.ControlPlaneNamespace = DefaultControlPlaneNamespace
	}
	if cfg.TrustDomain == "" {
		cfg.TrustDomain = DefaultTrustDomain
	}
	ca := cfg.CA
	if ca == nil {
		var err error
		// The trust anchor must cover both the injected clock (issued leaves)
		// and the real one (the serving certificate): start it at the earlier.
		start := cfg.Now()
		if real := time.Now(); real.Before(start) {
			start = real
		}
		ca, err = localca.New(localca.Config{
			Name:         "linkerdca test trust anchor",
			Intermediate: true,
			Now:          func() time.Time { return start },
		})
		if err != nil {
			return nil, fmt.Errorf("creating CA: %w", err)
		}
	}
	s := &Server{
		cfg:      cfg,
		ca:       ca,
		tokens:   make(map[string]string, len(cfg.Tokens)),
		rejected: map[string]bool{},
		ready:    !cfg.NotReady,
		lifetime: cfg.Lifetime,
	}
	for tok, id := range cfg.Tokens {
		s.tokens[tok] = id
	}
	return s, nil
}

// Identity is the Linkerd identity of a service account under the default
// control-plane namespace and trust domain.
func Identity(namespace, serviceAccount string) pki.Identity {
	return pki.LinkerdIdentity(DefaultTrustDomain, namespace, serviceAccount, DefaultControlPlaneNamespace)
}

// SetMode changes how accepted requests are answered.
func (s *Server) SetMode(m Mode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode = m
}

// SetReady says whether the issuer is ready; when it is not, every request
// fails with Unavailable, as Linkerd's identity service before it has loaded
// its issuer.
func (s *Server) SetReady(ready bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready = ready
}

// SetLifetime changes the lifetime of certificates issued from now on.
func (s *Server) SetLifetime(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lifetime = d
}

// AddToken makes tok prove identity.
func (s *Server) AddToken(tok, identity string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[tok] = identity
	delete(s.rejected, tok)
}

// RejectToken makes tok well formed but not authenticated (a revoked or
// expired service-account token): FailedPrecondition.
func (s *Server) RejectToken(tok string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejected[tok] = true
}

// Requests returns a copy of every Certify call received, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.requests))
	for i, r := range s.requests {
		r.CSR = append([]byte(nil), r.CSR...)
		out[i] = r
	}
	return out
}

// Tokens lists every token received, in order, valid or not (empty ones
// included).
func (s *Server) Tokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.requests))
	for i, r := range s.requests {
		out[i] = r.Token
	}
	return out
}

// Issued is the number of certificates issued.
func (s *Server) Issued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if r.Code == codes.OK {
			n++
		}
	}
	return n
}

type handler struct {
	identitypb.UnimplementedIdentityServer
	s *Server
}

// snapshot is the part of the server state one request acts on.
type snapshot struct {
	index    int
	ready    bool
	mode     Mode
	delay    time.Duration
	lifetime time.Duration
	tokenID  string
	known    bool
	rejected bool
}

func (h *handler) Certify(ctx context.Context, req *identitypb.CertifyRequest) (*identitypb.CertifyResponse, error) {
	snap := h.s.record(ctx, req)
	resp, err := h.certify(ctx, req, snap)
	h.s.finish(snap.index, status.Code(err))
	return resp, err
}

func (h *handler) certify(ctx context.Context, req *identitypb.CertifyRequest, snap snapshot) (*identitypb.CertifyResponse, error) {
	if err := testca.Wait(ctx, snap.delay); err != nil {
		return nil, err
	}
	if !snap.ready {
		return nil, status.Error(codes.Unavailable, "linkerdca: cert issuer not ready yet")
	}
	csr, err := checkRequest(req)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "linkerdca: %v", err)
	}
	if err := checkCSR(csr, req.GetIdentity()); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "linkerdca: %v", err)
	}
	if !snap.known && !snap.rejected && h.s.cfg.TokenReviews != nil {
		id, err := h.s.review(ctx, string(req.GetToken()), req.GetIdentity())
		if err != nil {
			return nil, err
		}
		snap.tokenID, snap.known = id, true
	}
	switch {
	case snap.rejected:
		return nil, status.Error(codes.FailedPrecondition, "linkerdca: authentication token could not be authenticated")
	case !snap.known:
		return nil, status.Error(codes.InvalidArgument, "linkerdca: invalid token")
	case snap.tokenID != req.GetIdentity():
		return nil, status.Errorf(codes.FailedPrecondition, "linkerdca: requested identity did not match provided token: requested=%s; found=%s", req.GetIdentity(), snap.tokenID)
	}
	resp, err := h.s.issue(snap, csr, req.GetIdentity())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "linkerdca: %v", err)
	}
	return resp, nil
}

// review authenticates tok by TokenReview and returns the identity it
// proves; the error is the status Linkerd answers.
func (s *Server) review(ctx context.Context, tok, requested string) (string, error) {
	r, err := s.cfg.TokenReviews.Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: tok, Audiences: []string{Audience}},
	}, metav1.CreateOptions{})
	rec := Review{Identity: requested}
	defer func() {
		s.mu.Lock()
		s.reviews = append(s.reviews, rec)
		s.mu.Unlock()
	}()
	if err != nil {
		rec.Err = err.Error()
		return "", status.Errorf(codes.Internal, "linkerdca: token review: %v", err)
	}
	st := r.Status
	rec.Authenticated, rec.Username, rec.Err = st.Authenticated, st.User.Username, st.Error
	if v := st.User.Extra["authentication.kubernetes.io/pod-name"]; len(v) > 0 {
		rec.PodName = v[0]
	}
	if v := st.User.Extra["authentication.kubernetes.io/pod-uid"]; len(v) > 0 {
		rec.PodUID = v[0]
	}
	if st.Error != "" {
		return "", status.Errorf(codes.InvalidArgument, "linkerdca: invalid token: %s", st.Error)
	}
	if !st.Authenticated {
		return "", status.Error(codes.FailedPrecondition, "linkerdca: authentication token could not be authenticated")
	}
	parts := strings.Split(st.User.Username, ":")
	if len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" {
		return "", status.Errorf(codes.InvalidArgument, "linkerdca: invalid token: not a service account's: %s", st.User.Username)
	}
	return pki.LinkerdIdentity(s.cfg.TrustDomain, parts[2], parts[3], s.cfg.ControlPlaneNamespace).DNSName, nil
}

// Reviews returns the TokenReviews made, in order.
func (s *Server) Reviews() []Review {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Review(nil), s.reviews...)
}

// record keeps what arrived and takes the state the request is answered with.
func (s *Server) record(ctx context.Context, req *identitypb.CertifyRequest) snapshot {
	var authz string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			authz = v[0]
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tok := string(req.GetToken())
	s.requests = append(s.requests, Request{
		Identity:      req.GetIdentity(),
		Token:         tok,
		CSR:           append([]byte(nil), req.GetCertificateSigningRequest()...),
		Authorization: authz,
		Code:          codes.Unknown,
	})
	snap := snapshot{
		index:    len(s.requests) - 1,
		ready:    s.ready,
		mode:     s.mode,
		delay:    s.Delay(),
		lifetime: s.lifetime,
		rejected: s.rejected[tok],
	}
	snap.tokenID, snap.known = s.tokens[tok]
	return snap
}

func (s *Server) finish(i int, code codes.Code) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests[i].Code = code
}

// checkRequest checks that every field is there and parses the CSR.
func checkRequest(req *identitypb.CertifyRequest) (*x509.CertificateRequest, error) {
	switch {
	case req.GetIdentity() == "":
		return nil, errors.New("missing identity")
	case len(req.GetToken()) == 0:
		return nil, errors.New("missing token")
	case len(req.GetCertificateSigningRequest()) == 0:
		return nil, errors.New("missing certificate signing request")
	}
	csr, err := x509.ParseCertificateRequest(req.GetCertificateSigningRequest())
	if err != nil {
		return nil, fmt.Errorf("certificate signing request is not DER: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate signing request signature: %w", err)
	}
	return csr, nil
}

// checkCSR applies Linkerd's rules: exactly one DNS SAN, equal to the
// identity; common name empty or equal; no email, IP or URI SANs.
func checkCSR(csr *x509.CertificateRequest, identity string) error {
	switch {
	case len(csr.DNSNames) != 1:
		return fmt.Errorf("CSR must have exactly one DNS name, has %d", len(csr.DNSNames))
	case csr.DNSNames[0] != identity:
		return fmt.Errorf("CSR name does not match requested identity: csr=%s; req=%s", csr.DNSNames[0], identity)
	case csr.Subject.CommonName != "" && csr.Subject.CommonName != identity:
		return fmt.Errorf("invalid common name %q", csr.Subject.CommonName)
	case len(csr.EmailAddresses) > 0:
		return errors.New("CSR carries email addresses")
	case len(csr.IPAddresses) > 0:
		return errors.New("CSR carries IP addresses")
	case len(csr.URIs) > 0:
		return errors.New("CSR carries URIs")
	}
	return nil
}

// issue builds the answer for an accepted request.
func (s *Server) issue(snap snapshot, csr *x509.CertificateRequest, identity string) (*identitypb.CertifyResponse, error) {
	if snap.mode == ModeGarbage {
		return &identitypb.CertifyResponse{
			LeafCertificate: []byte("not a certificate"),
			ValidUntil:      timestamppb.New(s.cfg.Now().Add(snap.lifetime)),
		}, nil
	}
	now := s.cfg.Now()
	leaf := localca.Leaf{
		PublicKey: csr.PublicKey,
		Identity:  pki.Identity{DNSName: identity},
		NotBefore: now.Add(-ClockSkew),
		NotAfter:  now.Add(snap.lifetime),
	}
	ca := s.ca
	switch snap.mode {
	case ModeWrongIdentity:
		leaf.Identity = Identity("wrong-namespace", "wrong-sa")
	case ModeExpired:
		leaf.NotBefore, leaf.NotAfter = now.Add(-snap.lifetime-time.Hour), now.Add(-time.Minute)
	case ModeWrongKey:
		k, err := pki.GenerateKey(pki.ECP256)
		if err != nil {
			return nil, err
		}
		leaf.PublicKey = k.Public()
	case ModeForeignChain:
		f, err := s.ForeignCA()
		if err != nil {
			return nil, err
		}
		ca = f
	}
	chain, err := ca.Issue(leaf)
	if err != nil {
		return nil, err
	}
	// Leaf and intermediates; the trust anchor (last) is not sent.
	chain = chain[:len(chain)-1]
	resp := &identitypb.CertifyResponse{ValidUntil: timestamppb.New(chain[0].NotAfter)}
	for i, c := range chain {
		der := c.Raw
		if snap.mode == ModePEM {
			der = pki.EncodeCertificates([]*x509.Certificate{c})
		}
		if i == 0 {
			resp.LeafCertificate = der
		} else {
			resp.IntermediateCertificates = append(resp.IntermediateCertificates, der)
		}
	}
	switch snap.mode {
	case ModeNoValidUntil:
		resp.ValidUntil = nil
	case ModeValidUntilMismatch:
		resp.ValidUntil = timestamppb.New(chain[0].NotAfter.Add(time.Hour))
	}
	return resp, nil
}

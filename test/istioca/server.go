package istioca

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pb "istio.io/api/security/v1alpha1"
	"k8s.io/client-go/kubernetes"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/testca"
)

// DefaultServerName is the DNS name of the default serving certificate, the
// name istiod presents inside a cluster.
const DefaultServerName = "istiod.istio-system.svc"

// DefaultPodCacheWait is Config.PodCacheWait's default: far longer than
// the pod informer usually lags the API server, short enough that a
// refusal is not slow.
const DefaultPodCacheWait = 200 * time.Millisecond

// DefaultTTL is the validity given when a request asks for none.
const DefaultTTL = 24 * time.Hour

// ServiceAccount is the Kubernetes identity a token stands for.
type ServiceAccount struct {
	Namespace string
	Name      string
}

// Mode says how the CA answers a request it accepted.
type Mode int

// The answer modes. Every mode except ModeError authenticates the caller and
// checks the CSR first; the bad answers are what a broken or hostile CA could
// return to an authenticated caller.
const (
	// ModeOK issues a correct certificate.
	ModeOK Mode = iota
	// ModeWrongSAN issues a certificate for another identity.
	ModeWrongSAN
	// ModeForeignChain issues from a CA whose root the client does not trust.
	ModeForeignChain
	// ModeExpired issues a certificate that has already expired.
	ModeExpired
	// ModeWrongKey issues a certificate for a key other than the CSR's.
	ModeWrongKey
	// ModeGarbage answers a chain that does not parse.
	ModeGarbage
	// ModeError fails every request with the code set by SetError.
	ModeError
	// ModeLeafIsCA issues a leaf that is itself a CA (basic constraints cA,
	// keyCertSign): the workload could mint any identity with it.
	ModeLeafIsCA
	// ModeNoDigitalSignature issues a leaf whose key usage lacks
	// digitalSignature.
	ModeNoDigitalSignature
)

var modeNames = [...]string{"ok", "wrong-san", "foreign-chain", "expired", "wrong-key", "garbage", "error", "leaf-is-ca", "no-digital-signature"}

// String names the mode.
func (m Mode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Config describes a test CA. Zero values get the defaults noted.
type Config struct {
	// TrustDomain of the issued SPIFFE IDs. Default "cluster.local".
	TrustDomain string
	// Tokens maps a bearer token to the caller's namespace and service account.
	Tokens map[string]ServiceAccount
	// CA signs everything. Nil means a fresh localca with an intermediate.
	CA *localca.CA
	// ServerNames are the DNS SANs of the serving certificate (which also
	// carries 127.0.0.1 and ::1). Default [DefaultServerName].
	ServerNames []string
	// Addr to listen on. Default "127.0.0.1:0".
	Addr string
	// Now is the clock for the validity of issued certificates. Default
	// time.Now. The serving certificate always uses the real time, since TLS
	// peers check it against the real time.
	Now func() time.Time
	// MaxTTL caps the validity of issued certificates, as istio-csr does.
	// Zero means no cap.
	MaxTTL time.Duration
	// BundleChain answers the whole chain as one PEM string instead of one
	// string per certificate, as some CAs do.
	BundleChain bool
	// Plaintext serves without TLS, like a control plane on port 15010. Only
	// bearer tokens authenticate then.
	Plaintext bool
	// Kube, when set, authenticates a bearer token that is not in Tokens by
	// a TokenReview against this API server, as istiod does. Start also
	// runs an informer on its pods for the node authorizer, and waits for
	// its first list.
	Kube kubernetes.Interface
	// PodCacheWait is how long the node authorizer waits for its pod
	// informer to show a pod it lacks before asking the API server. Default
	// DefaultPodCacheWait.
	PodCacheWait time.Duration
	// Audiences the TokenReview asks for. Default [DefaultAudience].
	Audiences []string
	// KeyOnlyCSR takes only the key of a CSR, once its signature checks,
	// as istiod's own CA does: a CSR naming nothing (the kubelet's stub
	// CSR of a PodCertificateRequest) is signed. Without it the CSR must
	// name exactly the caller's identity, as istio-csr wants.
	KeyOnlyCSR bool
	// TrustedNodeAccounts may ask for another identity with
	// ImpersonatedIdentity in the request metadata (istiod's
	// CA_TRUSTED_NODE_ACCOUNTS). Only callers authenticated by TokenReview.
	TrustedNodeAccounts []ServiceAccount
	// ServerTLS, when set, changes the server's TLS configuration
	// (testca.Config.ServerTLS).
	ServerTLS func(*tls.Config)
}

// Server is a running test CA. Its Endpoint serves it: Addr, ServerName,
// RootPEM, Roots, CA, Stop, Restart, SetServingCert and SetDelay.
type Server struct {
	*testca.Endpoint
	cfg Config
	ca  *localca.CA

	mu          sync.Mutex
	tokens      map[string]ServiceAccount
	mode        Mode
	errCode     codes.Code
	failN       int
	failCode    codes.Code
	next        *hold                 // the next call to arrive waits on it (HoldNext)
	refused     map[string]codes.Code // by identity (RefuseIdentity)
	requests    int
	csrs        []CSRRecord
	inFlight    int // CreateCertificate calls not yet answered
	maxInFlight int // the most there ever were at once
	lastMD      metadata.MD
	lastReq     *pb.IstioCertificateRequest
	seen        []string    // every bearer token received, in order
	reviews     []Review    // every TokenReview made, in order
	denials     []string    // why impersonation requests were refused, in order
	podMisses   int         // node authorizer look-ups its pod cache lacked at first
	podReads    int         // of those, the ones read from the API server
	issuer      *localca.CA // signs issued certificates when set (SetIssuer); else ca

	pods *podCache // with Config.Kube; set by Start before serving
}

// Start serves a new test CA over TLS and stops it when the test ends. With
// Config.Kube it first starts the pod informer and waits until it has
// listed every pod (at most 30 s; the test fails then).
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	s, err := newServer(cfg)
	if err != nil {
		t.Fatalf("istioca: %v", err)
	}
	if cfg.Kube != nil {
		pods, err := startPodCache(cfg.Kube)
		if err != nil {
			t.Fatalf("istioca: %v", err)
		}
		s.pods = pods
		t.Cleanup(pods.stop)
	}
	s.Endpoint = testca.Serve(t, testca.Config{
		Name: "istioca", CA: s.ca, ServerNames: s.cfg.ServerNames, Addr: s.cfg.Addr,
		Plaintext: s.cfg.Plaintext, VerifyClientCerts: true, Now: s.cfg.Now,
		Register:  func(g *grpc.Server) { pb.RegisterIstioCertificateServiceServer(g, &handler{s: s}) },
		ServerTLS: s.cfg.ServerTLS,
	})
	return s
}

func newServer(cfg Config) (*Server, error) {
	if cfg.TrustDomain == "" {
		cfg.TrustDomain = "cluster.local"
	}
	if len(cfg.ServerNames) == 0 {
		cfg.ServerNames = []string{DefaultServerName}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.PodCacheWait <= 0 {
		cfg.PodCacheWait = DefaultPodCacheWait
	}
	ca := cfg.CA
	if ca == nil {
		var err error
		ca, err = localca.New(localca.Config{Name: "istioca test root", Intermediate: true})
		if err != nil {
			return nil, fmt.Errorf("creating CA: %w", err)
		}
	}
	s := &Server{cfg: cfg, ca: ca, errCode: codes.Unavailable, tokens: make(map[string]ServiceAccount, len(cfg.Tokens))}
	for tok, sa := range cfg.Tokens {
		s.tokens[tok] = sa
	}
	return s, nil
}

// TrustDomain of the issued identities.
func (s *Server) TrustDomain() string { return s.cfg.TrustDomain }

// SetMode changes how accepted requests are answered.
func (s *Server) SetMode(m Mode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode = m
}

// SetError sets the code ModeError fails with. Default Unavailable.
func (s *Server) SetError(code codes.Code) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errCode = code
}

// FailNext fails the next n requests with code, whatever the mode, then goes
// back to the mode.
func (s *Server) FailNext(n int, code codes.Code) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failN, s.failCode = n, code
}

// AddToken makes tok authenticate as sa.
func (s *Server) AddToken(tok string, sa ServiceAccount) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[tok] = sa
}

// Requests is the number of CreateCertificate calls received, accepted or not.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// LastMetadata is a copy of the gRPC metadata of the last call received, or
// nil before the first.
func (s *Server) LastMetadata() metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastMD == nil {
		return nil
	}
	return s.lastMD.Copy()
}

// LastRequest is a copy of the last request received, or nil.
func (s *Server) LastRequest() *pb.IstioCertificateRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastReq == nil {
		return nil
	}
	return proto.Clone(s.lastReq).(*pb.IstioCertificateRequest)
}

// Tokens lists every bearer token received, in order, valid or not.
func (s *Server) Tokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

// Identity is the SPIFFE identity of a service account in this trust domain.
func (s *Server) Identity(sa ServiceAccount) pki.Identity {
	return pki.SPIFFEIdentity(s.cfg.TrustDomain, sa.Namespace, sa.Name)
}

type handler struct {
	pb.UnimplementedIstioCertificateServiceServer
	s *Server
}

// snapshot is the part of the server state one request acts on.
type snapshot struct {
	mode    Mode
	errCode codes.Code
	fail    bool
	delay   time.Duration
	hold    *hold
	token   string
	hasTok  bool
	sa      ServiceAccount
	knownSA bool
	index   int // of the request's CSRRecord
}

func (h *handler) CreateCertificate(ctx context.Context, req *pb.IstioCertificateRequest) (resp *pb.IstioCertificateResponse, err error) {
	snap := h.s.record(ctx, req)
	defer func() { h.s.answered(snap.index, err == nil) }()
	if err := snap.hold.wait(ctx); err != nil {
		return nil, err
	}
	if err := testca.Wait(ctx, snap.delay); err != nil {
		return nil, err
	}
	if snap.fail {
		return nil, status.Errorf(snap.errCode, "istioca: told to fail with %s", snap.errCode)
	}
	if snap.mode == ModeError {
		return nil, status.Errorf(snap.errCode, "istioca: told to fail with %s", snap.errCode)
	}
	c, err := h.s.authenticate(ctx, snap)
	if err != nil {
		return nil, err
	}
	id := c.id
	if want, ok := impersonated(req); ok {
		id, err = h.s.authorizeImpersonation(ctx, c, want)
		if err != nil {
			h.s.deny(err)
			return nil, status.Error(codes.Unauthenticated, errDenied)
		}
	}
	csr, err := parseCSR(req.GetCsr())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "istioca: %v", err)
	}
	if !h.s.cfg.KeyOnlyCSR {
		if err := checkCSR(csr, id); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "istioca: %v", err)
		}
	}
	chain, err := h.s.issue(snap.mode, csr, id, h.s.ttl(req.GetValidityDuration()))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "istioca: %v", err)
	}
	return &pb.IstioCertificateResponse{CertChain: chain}, nil
}

// record counts the request, keeps what arrived, and takes the state the
// request will be answered with.
func (s *Server) record(ctx context.Context, req *pb.IstioCertificateRequest) snapshot {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	ident := csrIdentity(req.GetCsr())
	s.csrs = append(s.csrs, CSRRecord{At: time.Now(), Identity: ident})
	s.inFlight++
	s.maxInFlight = max(s.maxInFlight, s.inFlight)
	s.lastMD = md.Copy()
	if s.lastMD == nil {
		s.lastMD = metadata.MD{}
	}
	s.lastReq = proto.Clone(req).(*pb.IstioCertificateRequest)
	snap := snapshot{mode: s.mode, errCode: s.errCode, delay: s.Delay(), hold: s.takeHold(), index: len(s.csrs) - 1}
	if s.failN > 0 {
		s.failN--
		snap.fail, snap.errCode = true, s.failCode
	}
	if code, ok := s.refusal(ident); ok {
		snap.fail, snap.errCode = true, code
	}
	if v := md.Get("authorization"); len(v) > 0 {
		s.seen = append(s.seen, v[0])
		if tok, ok := strings.CutPrefix(v[0], "Bearer "); ok {
			snap.token, snap.hasTok = tok, true
			snap.sa, snap.knownSA = s.tokens[tok]
		}
	}
	return snap
}

// authenticate returns the caller: from a verified client certificate of
// this trust domain, else from the bearer token (the token table first, then
// a TokenReview when Kube is set).
func (s *Server) authenticate(ctx context.Context, snap snapshot) (caller, error) {
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			if id, ok := s.spiffeID(ti.State.VerifiedChains[0][0]); ok {
				return caller{id: id}, nil
			}
		}
	}
	switch {
	case !snap.hasTok:
		return caller{}, status.Error(codes.Unauthenticated, "istioca: no bearer token and no client certificate of this trust domain")
	case snap.knownSA:
		return caller{id: s.Identity(snap.sa)}, nil
	case s.cfg.Kube == nil:
		return caller{}, status.Error(codes.Unauthenticated, "istioca: unknown bearer token")
	}
	r, err := s.review(ctx, snap.token)
	s.mu.Lock()
	s.reviews = append(s.reviews, r)
	s.mu.Unlock()
	if err != nil {
		return caller{}, status.Errorf(codes.Unauthenticated, "istioca: token review: %v", err)
	}
	return caller{id: s.Identity(r.ServiceAccount), review: &r}, nil
}

// impersonated returns the identity named in the request metadata's
// ImpersonatedIdentity field, if any.
func impersonated(req *pb.IstioCertificateRequest) (string, bool) {
	v, ok := req.GetMetadata().GetFields()[ImpersonatedIdentityKey]
	if !ok {
		return "", false
	}
	return v.GetStringValue(), true
}

func (s *Server) deny(reason error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.denials = append(s.denials, reason.Error())
}

// Reviews lists every TokenReview the CA made, in order.
func (s *Server) Reviews() []Review {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Review(nil), s.reviews...)
}

// Denials lists why impersonation requests were refused, in order (the
// caller is told only that authentication failed).
func (s *Server) Denials() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.denials...)
}

// spiffeID returns the identity of a client certificate when it carries
// exactly one URI SAN, a SPIFFE ID of this trust domain.
func (s *Server) spiffeID(leaf *x509.Certificate) (pki.Identity, bool) {
	if len(leaf.URIs) != 1 {
		return pki.Identity{}, false
	}
	id, err := spiffeid.FromURI(leaf.URIs[0])
	if err != nil || id.TrustDomain().Name() != s.cfg.TrustDomain {
		return pki.Identity{}, false
	}
	return pki.Identity{SPIFFEID: id.String()}, true
}

func parseCSR(s string) (*x509.CertificateRequest, error) {
	if block, _ := pem.Decode([]byte(s)); block == nil {
		return nil, errors.New("CSR is not PEM")
	}
	return pki.ParseCSR([]byte(s))
}

// checkCSR applies istio-csr's rules: no DNS names, IPs, emails or common
// name, and the URI SANs are exactly the caller's identity.
func checkCSR(csr *x509.CertificateRequest, id pki.Identity) error {
	switch {
	case len(csr.DNSNames) > 0:
		return fmt.Errorf("CSR carries DNS names %v", csr.DNSNames)
	case len(csr.IPAddresses) > 0:
		return fmt.Errorf("CSR carries IP addresses %v", csr.IPAddresses)
	case len(csr.EmailAddresses) > 0:
		return fmt.Errorf("CSR carries email addresses %v", csr.EmailAddresses)
	case csr.Subject.CommonName != "":
		return fmt.Errorf("CSR carries common name %q", csr.Subject.CommonName)
	case len(csr.URIs) != 1 || !(pki.Identity{SPIFFEID: csr.URIs[0].String()}).Matches(id):
		got := make([]string, len(csr.URIs))
		for i, u := range csr.URIs {
			got[i] = u.String()
		}
		return fmt.Errorf("CSR asks for URI SANs %v, caller is %s", got, id)
	}
	return nil
}

// ttl is the validity to grant for a request asking for secs seconds.
func (s *Server) ttl(secs int64) time.Duration {
	d := DefaultTTL
	if secs > 0 {
		if secs > int64(math.MaxInt64/int64(time.Second)) {
			d = time.Duration(math.MaxInt64)
		} else {
			d = time.Duration(secs) * time.Second
		}
	}
	if s.cfg.MaxTTL > 0 && d > s.cfg.MaxTTL {
		d = s.cfg.MaxTTL
	}
	return d
}

// issue builds the answer for mode.
func (s *Server) issue(mode Mode, csr *x509.CertificateRequest, id pki.Identity, ttl time.Duration) ([]string, error) {
	if mode == ModeGarbage {
		return []string{"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n", "garbage"}, nil
	}
	now := s.cfg.Now()
	notAfter := now.Add(ttl)
	if notAfter.Before(now) { // overflow
		notAfter = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
	}
	leaf := localca.Leaf{PublicKey: csr.PublicKey, Identity: id, NotBefore: now.Add(-time.Minute), NotAfter: notAfter}
	ca := s.issuing()
	switch mode {
	case ModeWrongSAN:
		leaf.Identity = pki.SPIFFEIdentity(s.cfg.TrustDomain, "wrong-namespace", "wrong-sa")
	case ModeForeignChain:
		f, err := s.ForeignCA()
		if err != nil {
			return nil, err
		}
		ca = f
	case ModeExpired:
		leaf.NotBefore, leaf.NotAfter = now.Add(-ttl-time.Hour), now.Add(-time.Minute)
	case ModeWrongKey:
		k, err := pki.GenerateKey(pki.ECP256)
		if err != nil {
			return nil, err
		}
		leaf.PublicKey = k.Public()
	case ModeLeafIsCA:
		leaf.Edit = func(c *x509.Certificate) {
			c.IsCA, c.BasicConstraintsValid = true, true
			c.KeyUsage |= x509.KeyUsageCertSign
		}
	case ModeNoDigitalSignature:
		leaf.Edit = func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageKeyEncipherment }
	}
	chain, err := ca.Issue(leaf)
	if err != nil {
		return nil, err
	}
	if s.cfg.BundleChain {
		return []string{string(pki.EncodeCertificates(chain))}, nil
	}
	out := make([]string, len(chain))
	for i, c := range chain {
		out[i] = string(pki.EncodeCertificates([]*x509.Certificate{c}))
	}
	return out, nil
}

package linkerd_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/caclient/linkerd"
	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/linkerdca"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const token = "projected-token-of-web"

var webID = linkerdca.Identity("default", "web")

type env struct {
	s       *linkerdca.Server
	tokFile string
	c       *linkerd.Client
	reg     *prometheus.Registry
	key     crypto.Signer
	csr     []byte
}

// setup starts a test identity service that knows the token of web, and a
// client for it reading the token from a file, verifying against the
// service's trust anchor with the default server name.
func setup(t *testing.T, scfg linkerdca.Config, edit func(*linkerd.Config)) *env {
	t.Helper()
	if scfg.Tokens == nil {
		scfg.Tokens = map[string]string{token: webID.DNSName}
	}
	s := linkerdca.Start(t, scfg)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := linkerd.Config{
		Transport: controlplane.Config{
			Addr:  s.Addr(),
			Roots: controlplane.StaticRoots{Pool: s.Roots()},
		},
		Token:      credfetcher.File{Path: tokFile},
		Registerer: reg,
		Timeout:    5 * time.Second,
	}
	if edit != nil {
		edit(&cfg)
	}
	c, err := linkerd.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, webID)
	if err != nil {
		t.Fatal(err)
	}
	return &env{s: s, tokFile: tokFile, c: c, reg: reg, key: key, csr: csr}
}

func (e *env) sign(t *testing.T) ([]*x509.Certificate, error) {
	t.Helper()
	return e.c.Sign(context.Background(), e.csr, webID, time.Hour)
}

// outcomes is meshagent_linkerd_identity_requests_total{outcome=outcome}.
func (e *env) outcomes(outcome string) float64 {
	return metricValue(e.reg, "meshagent_linkerd_identity_requests_total", "outcome", outcome)
}

// metricValue reads one counter sample from reg; 0 when it is absent.
func metricValue(reg *prometheus.Registry, name, label, value string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func (e *env) writeToken(t *testing.T, tok string) {
	t.Helper()
	if err := os.WriteFile(e.tokFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultServerNameMatchesLinkerd(t *testing.T) {
	s, err := pki.LinkerdScheme("cluster.local", "linkerd")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CAServerName(); got != linkerdca.DefaultServerName {
		t.Fatalf("CAServerName = %q, want %q", got, linkerdca.DefaultServerName)
	}
}

func TestSignIssuesDNSIdentity(t *testing.T) {
	e := setup(t, linkerdca.Config{}, nil)
	chain, err := e.sign(t)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 {
		t.Fatalf("chain has %d certificates, want leaf and issuer", len(chain))
	}
	leaf := chain[0]
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != webID.DNSName || len(leaf.URIs) != 0 {
		t.Fatalf("leaf names DNS %v URI %v, want only %s", leaf.DNSNames, leaf.URIs, webID.DNSName)
	}
	if err := pki.VerifyIssued(chain, e.key.Public(), webID, e.s.Roots(), time.Now()); err != nil {
		t.Fatalf("VerifyIssued: %v", err)
	}
	reqs := e.s.Requests()
	if len(reqs) != 1 {
		t.Fatalf("server saw %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.Identity != webID.DNSName || r.Token != token || string(r.CSR) != string(e.csr) {
		t.Errorf("server saw identity %q token %q CSR equal %v", r.Identity, r.Token, string(r.CSR) == string(e.csr))
	}
	if got := e.outcomes("OK"); got != 1 {
		t.Errorf("requests_total{outcome=OK} = %v, want 1", got)
	}
}

func TestSignAcceptsPEMCSR(t *testing.T) {
	e := setup(t, linkerdca.Config{}, nil)
	if _, err := e.c.Sign(context.Background(), pki.EncodeCSRPEM(e.csr), webID, 0); err != nil {
		t.Fatal(err)
	}
	if got := e.s.Requests()[0].CSR; string(got) != string(e.csr) {
		t.Fatal("the CSR did not travel as DER")
	}
}

// The token must never reach a service that presents another name, or a
// chain the trust anchors do not cover: the server sees no request at all.
func TestTokenNeverSentToUnverifiedService(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, s *linkerdca.Server)
		edit  func(*linkerd.Config)
	}{
		{
			name: "unexpected name",
			setup: func(t *testing.T, s *linkerdca.Server) {
				c, err := s.ServingCert("linkerd-identity.other.serviceaccount.identity.other.cluster.local")
				if err != nil {
					t.Fatal(err)
				}
				s.SetServingCert(c)
			},
		},
		{
			name: "expected name, configured name differs",
			edit: func(c *linkerd.Config) { c.Scheme, _ = pki.LinkerdScheme("cluster.local", "linkerd-prod") },
		},
		{
			name: "untrusted chain",
			edit: func(c *linkerd.Config) {
				c.Transport.Roots = controlplane.StaticRoots{Pool: x509.NewCertPool()}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := setup(t, linkerdca.Config{}, tt.edit)
			if tt.setup != nil {
				tt.setup(t, e.s)
			}
			_, err := e.sign(t)
			if err == nil {
				t.Fatal("Sign succeeded against an unverified service")
			}
			if n := len(e.s.Requests()); n != 0 {
				t.Fatalf("server saw %d requests (tokens %q)", n, e.s.Tokens())
			}
		})
	}
}

// Even when the transport credentials are replaced by ones that verify
// nothing, the token stays home: the per-call check refuses the peer before
// any of the request is sent.
func TestTokenWithheldWhenTransportDoesNotVerify(t *testing.T) {
	e := setup(t, linkerdca.Config{}, func(c *linkerd.Config) {
		c.Transport.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			InsecureSkipVerify: true, //nolint:gosec // the point of the test
		}))}
	})
	other, err := e.s.ServingCert("evil.example")
	if err != nil {
		t.Fatal(err)
	}
	e.s.SetServingCert(other)
	_, err = e.sign(t)
	if !errors.Is(err, controlplane.ErrUnverifiedPeer) {
		t.Fatalf("Sign error %v, want ErrUnverifiedPeer", err)
	}
	if n := len(e.s.Requests()); n != 0 {
		t.Fatalf("server saw %d requests (tokens %q)", n, e.s.Tokens())
	}
	if got := e.outcomes("unverified_peer"); got != 1 {
		t.Errorf("requests_total{outcome=unverified_peer} = %v, want 1", got)
	}

	// The same lax transport against the right name passes the check.
	right, err := e.s.ServingCert(linkerdca.DefaultServerName)
	if err != nil {
		t.Fatal(err)
	}
	e.s.SetServingCert(right)
	if _, err := e.sign(t); err != nil {
		t.Fatalf("Sign against the expected name: %v", err)
	}
}

func TestPlaintextLoopback(t *testing.T) {
	e := setup(t, linkerdca.Config{Plaintext: true}, func(c *linkerd.Config) { c.Transport.Plaintext = true })
	if _, err := e.sign(t); err != nil {
		t.Fatal(err)
	}
	if toks := e.s.Tokens(); len(toks) != 1 || toks[0] != token {
		t.Fatalf("server saw tokens %q", toks)
	}
}

func TestServiceErrors(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, e *env)
		want    codes.Code
	}{
		{
			name:    "bad token",
			prepare: func(t *testing.T, e *env) { e.writeToken(t, "not-a-known-token") },
			want:    codes.InvalidArgument,
		},
		{
			name:    "rejected token",
			prepare: func(t *testing.T, e *env) { e.s.RejectToken(token) },
			want:    codes.FailedPrecondition,
		},
		{
			name: "CSR with an extra SAN",
			prepare: func(t *testing.T, e *env) {
				der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{webID.DNSName, "extra.example"}}, e.key)
				if err != nil {
					t.Fatal(err)
				}
				e.csr = der
			},
			want: codes.FailedPrecondition,
		},
		{
			name:    "token of another identity",
			prepare: func(t *testing.T, e *env) { e.s.AddToken(token, linkerdca.Identity("default", "db").DNSName) },
			want:    codes.FailedPrecondition,
		},
		{
			name:    "issuer not ready",
			prepare: func(t *testing.T, e *env) { e.s.SetReady(false) },
			want:    codes.Unavailable,
		},
		{
			name:    "service down",
			prepare: func(t *testing.T, e *env) { e.s.Stop() },
			want:    codes.Unavailable,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := setup(t, linkerdca.Config{}, nil)
			tt.prepare(t, e)
			chain, err := e.sign(t)
			if err == nil {
				t.Fatalf("Sign succeeded with %d certificates", len(chain))
			}
			if got := status.Code(err); got != tt.want {
				t.Fatalf("status.Code = %s (%v), want %s", got, err, tt.want)
			}
			var se interface{ GRPCStatus() *status.Status }
			if !errors.As(err, &se) {
				t.Errorf("gRPC status not in the error chain: %v", err)
			}
			if got := e.outcomes(tt.want.String()); got != 1 {
				t.Errorf("requests_total{outcome=%s} = %v, want 1", tt.want, got)
			}
		})
	}
}

// refusalRecorder hands out token and records what it was told was refused.
type refusalRecorder struct {
	mu      sync.Mutex
	refused []string
}

func (r *refusalRecorder) Token(context.Context) (string, error) { return token, nil }

func (r *refusalRecorder) Invalidate(tok string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused = append(r.refused, tok)
}

func TestRefusedTokenIsReported(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(e *env)
		refused bool
	}{
		{"rejected token", func(e *env) { e.s.RejectToken(token) }, true},
		{"issuer not ready", func(e *env) { e.s.SetReady(false) }, false},
		{"accepted", func(*env) {}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &refusalRecorder{}
			e := setup(t, linkerdca.Config{}, func(c *linkerd.Config) { c.Token = rec })
			tt.prepare(e)
			_, _ = e.sign(t)
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if tt.refused != (len(rec.refused) == 1 && rec.refused[0] == token) || len(rec.refused) > 1 {
				t.Errorf("refused tokens %v, want refused=%v", rec.refused, tt.refused)
			}
		})
	}
}

// TestTokenForChoosesPerIdentity: with TokenFor, each identity's request
// carries the token of that identity's source (Token is not read), a refusal
// is reported to that source, and a source error fails the call before any
// request is sent.
func TestTokenForChoosesPerIdentity(t *testing.T) {
	dbID := linkerdca.Identity("default", "db")
	sources := map[string]*refusalRecorder{}
	tokenFor := func(id pki.Identity) (credfetcher.Fetcher, error) {
		r, ok := sources[id.DNSName]
		if !ok {
			return nil, errors.New("no pod")
		}
		return r, nil
	}
	web := &refusalRecorder{}
	sources[webID.DNSName] = web
	e := setup(t, linkerdca.Config{}, func(c *linkerd.Config) {
		c.Token = credfetcher.File{Path: "/nonexistent"}
		c.TokenFor = tokenFor
	})
	if _, err := e.sign(t); err != nil {
		t.Fatalf("web: %v", err)
	}
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	dbCSR, err := pki.NewCSR(key, dbID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Sign(context.Background(), dbCSR, dbID, time.Hour); err == nil || !strings.Contains(err.Error(), "no pod") {
		t.Fatalf("db without a source: %v, want the source's error", err)
	}
	if n := len(e.s.Requests()); n != 1 {
		t.Fatalf("server saw %d requests, want 1 (none for db)", n)
	}
	// web's token (the only one the server knows) is refused for db:
	// reported to db's source, not web's.
	db := &refusalRecorder{}
	sources[dbID.DNSName] = db
	if _, err := e.c.Sign(context.Background(), dbCSR, dbID, time.Hour); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("db with web's token: %v, want FailedPrecondition", err)
	}
	if len(db.refused) != 1 || len(web.refused) != 0 {
		t.Fatalf("refusals: db %v web %v, want one to db only", db.refused, web.refused)
	}
}

package linkerdca

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/caclient/linkerd/identitypb"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/kubeenv"
)

// kube is the package's API server, started by the first test that needs it.
var kube = &kubeenv.Shared{}

func TestMain(m *testing.M) {
	os.Exit(kube.Main(m))
}

const token = "token-of-web"

var webID = Identity("default", "web")

// dial connects to s over TLS, checking the serving name.
func dial(t *testing.T, s *Server) identitypb.IdentityClient {
	t.Helper()
	tc := &tls.Config{RootCAs: s.Roots(), ServerName: s.ServerName(), MinVersion: tls.VersionTLS12}
	conn, err := grpc.NewClient("passthrough:///"+s.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return identitypb.NewIdentityClient(conn)
}

func newKey(t *testing.T) crypto.Signer {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func csrWith(t *testing.T, key crypto.Signer, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func certify(ctx context.Context, c identitypb.IdentityClient, id string, tok string, csr []byte) (*identitypb.CertifyResponse, error) {
	return c.Certify(ctx, &identitypb.CertifyRequest{Identity: id, Token: []byte(tok), CertificateSigningRequest: csr})
}

func TestCertifyIssuesDERChain(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	s := Start(t, Config{Tokens: map[string]string{token: webID.DNSName}, Now: func() time.Time { return now }, Lifetime: time.Hour})
	c := dial(t, s)
	key := newKey(t)
	csr, err := pki.NewCSR(key, webID)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := certify(context.Background(), c, webID.DNSName, token, csr)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetIntermediateCertificates()) != 1 {
		t.Fatalf("got %d intermediates, want 1 (the issuer, not the trust anchor)", len(resp.GetIntermediateCertificates()))
	}
	chain, err := pki.ParseCertificatesDER(append([][]byte{resp.GetLeafCertificate()}, resp.GetIntermediateCertificates()...)...)
	if err != nil {
		t.Fatal(err)
	}
	leaf := chain[0]
	if err := pki.VerifyIssued(chain, key.Public(), webID, s.Roots(), now); err != nil {
		t.Fatalf("VerifyIssued: %v", err)
	}
	if !leaf.NotBefore.Equal(now.Add(-ClockSkew)) || !leaf.NotAfter.Equal(now.Add(time.Hour)) {
		t.Errorf("validity %s..%s, want %s..%s", leaf.NotBefore, leaf.NotAfter, now.Add(-ClockSkew), now.Add(time.Hour))
	}
	if !resp.GetValidUntil().AsTime().Equal(leaf.NotAfter) {
		t.Errorf("valid_until %s, leaf NotAfter %s", resp.GetValidUntil().AsTime(), leaf.NotAfter)
	}
	reqs := s.Requests()
	if len(reqs) != 1 || reqs[0].Token != token || reqs[0].Identity != webID.DNSName || reqs[0].Code != codes.OK || string(reqs[0].CSR) != string(csr) {
		t.Errorf("recorded %+v", reqs)
	}
	if s.Issued() != 1 {
		t.Errorf("Issued() = %d, want 1", s.Issued())
	}
}

func TestCertifyValidation(t *testing.T) {
	s := Start(t, Config{Tokens: map[string]string{token: webID.DNSName, "token-of-db": Identity("default", "db").DNSName}})
	s.RejectToken("revoked")
	c := dial(t, s)
	key := newKey(t)
	good := csrWith(t, key, &x509.CertificateRequest{DNSNames: []string{webID.DNSName}})
	tests := []struct {
		name  string
		id    string
		token string
		csr   []byte
		want  codes.Code
	}{
		{"accepted", webID.DNSName, token, good, codes.OK},
		{"common name equal to identity", webID.DNSName, token, csrWith(t, key, &x509.CertificateRequest{Subject: pkix.Name{CommonName: webID.DNSName}, DNSNames: []string{webID.DNSName}}), codes.OK},
		{"missing identity", "", token, good, codes.InvalidArgument},
		{"missing token", webID.DNSName, "", good, codes.InvalidArgument},
		{"missing CSR", webID.DNSName, token, nil, codes.InvalidArgument},
		{"CSR not DER", webID.DNSName, token, pki.EncodeCSRPEM(good), codes.InvalidArgument},
		{"unknown token", webID.DNSName, "who-knows", good, codes.InvalidArgument},
		{"rejected token", webID.DNSName, "revoked", good, codes.FailedPrecondition},
		{"token of another identity", webID.DNSName, "token-of-db", good, codes.FailedPrecondition},
		{"no DNS SAN", webID.DNSName, token, csrWith(t, key, &x509.CertificateRequest{}), codes.FailedPrecondition},
		{"extra DNS SAN", webID.DNSName, token, csrWith(t, key, &x509.CertificateRequest{DNSNames: []string{webID.DNSName, "extra.example"}}), codes.FailedPrecondition},
		{"other DNS SAN", webID.DNSName, token, csrWith(t, key, &x509.CertificateRequest{DNSNames: []string{"db.default.serviceaccount.identity.linkerd.cluster.local"}}), codes.FailedPrecondition},
		{"other common name", webID.DNSName, token, csrWith(t, key, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "web"}, DNSNames: []string{webID.DNSName}}), codes.FailedPrecondition},
		{"IP SAN", webID.DNSName, token, csrWith(t, key, &x509.CertificateRequest{DNSNames: []string{webID.DNSName}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}), codes.FailedPrecondition},
		{"email SAN", webID.DNSName, token, csrWith(t, key, &x509.CertificateRequest{DNSNames: []string{webID.DNSName}, EmailAddresses: []string{"a@example.com"}}), codes.FailedPrecondition},
		{"URI SAN", webID.DNSName, token, csrWith(t, key, &x509.CertificateRequest{DNSNames: []string{webID.DNSName}, URIs: []*url.URL{{Scheme: "spiffe", Host: "cluster.local", Path: "/ns/default/sa/web"}}}), codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := certify(context.Background(), c, tt.id, tt.token, tt.csr)
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code %s (%v), want %s", got, err, tt.want)
			}
		})
	}
	if got, want := len(s.Tokens()), len(tests); got != want {
		t.Errorf("recorded %d tokens, want %d", got, want)
	}
}

func TestNotReadyIsUnavailable(t *testing.T) {
	s := Start(t, Config{Tokens: map[string]string{token: webID.DNSName}, NotReady: true})
	c := dial(t, s)
	csr, err := pki.NewCSR(newKey(t), webID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := certify(context.Background(), c, webID.DNSName, token, csr); status.Code(err) != codes.Unavailable {
		t.Fatalf("not ready: %v, want Unavailable", err)
	}
	s.SetReady(true)
	if _, err := certify(context.Background(), c, webID.DNSName, token, csr); err != nil {
		t.Fatalf("ready: %v", err)
	}
}

func TestModes(t *testing.T) {
	now := time.Now()
	s := Start(t, Config{Tokens: map[string]string{token: webID.DNSName}})
	c := dial(t, s)
	key := newKey(t)
	csr, err := pki.NewCSR(key, webID)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		mode      Mode
		parseErr  bool
		verifyErr error
	}{
		{mode: ModeOK},
		{mode: ModeWrongIdentity, verifyErr: pki.ErrIdentityMismatch},
		{mode: ModeExpired, verifyErr: pki.ErrNotValidNow},
		{mode: ModeWrongKey, verifyErr: pki.ErrKeyMismatch},
		{mode: ModeForeignChain, verifyErr: pki.ErrUntrustedChain},
		{mode: ModeGarbage, parseErr: true},
		{mode: ModePEM, parseErr: true},
		{mode: ModeNoValidUntil},
		{mode: ModeValidUntilMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			s.SetMode(tt.mode)
			resp, err := certify(context.Background(), c, webID.DNSName, token, csr)
			if err != nil {
				t.Fatal(err)
			}
			chain, err := pki.ParseCertificatesDER(append([][]byte{resp.GetLeafCertificate()}, resp.GetIntermediateCertificates()...)...)
			if tt.parseErr {
				if err == nil {
					t.Fatal("answer parsed, want garbage")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			err = pki.VerifyIssued(chain, key.Public(), webID, s.Roots(), now)
			if tt.verifyErr == nil && err != nil || tt.verifyErr != nil && !errors.Is(err, tt.verifyErr) {
				t.Fatalf("VerifyIssued: %v, want %v", err, tt.verifyErr)
			}
			switch tt.mode {
			case ModeNoValidUntil:
				if resp.GetValidUntil() != nil {
					t.Error("valid_until set")
				}
			case ModeValidUntilMismatch:
				if d := resp.GetValidUntil().AsTime().Sub(chain[0].NotAfter); d != time.Hour {
					t.Errorf("valid_until - NotAfter = %s, want 1h", d)
				}
			}
		})
	}
}

func TestStopRestartSamePort(t *testing.T) {
	s := Start(t, Config{Tokens: map[string]string{token: webID.DNSName}})
	addr := s.Addr()
	s.Stop()
	s.Stop() // twice is fine
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = conn.Close()
		t.Fatal("stopped server still accepts connections")
	}
	s.Restart(t)
	if s.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", s.Addr(), addr)
	}
	csr, err := pki.NewCSR(newKey(t), webID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := certify(context.Background(), dial(t, s), webID.DNSName, token, csr); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

func TestDelayHonoursDeadline(t *testing.T) {
	s := Start(t, Config{Tokens: map[string]string{token: webID.DNSName}})
	s.SetDelay(time.Hour)
	csr, err := pki.NewCSR(newKey(t), webID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := certify(ctx, dial(t, s), webID.DNSName, token, csr); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
}

func TestServingCertChange(t *testing.T) {
	s := Start(t, Config{Tokens: map[string]string{token: webID.DNSName}})
	other, err := s.ServingCert("unexpected.example")
	if err != nil {
		t.Fatal(err)
	}
	s.SetServingCert(other)
	csr, err := pki.NewCSR(newKey(t), webID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := certify(context.Background(), dial(t, s), webID.DNSName, token, csr); err == nil {
		t.Fatal("handshake with a certificate for another name succeeded")
	}
	if n := len(s.Requests()); n != 0 {
		t.Fatalf("server recorded %d requests over a failed handshake", n)
	}
}

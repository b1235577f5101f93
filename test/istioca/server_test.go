package istioca

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
)

const token = "sa-token"

var sa = ServiceAccount{Namespace: "shop", Name: "app"}

func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	if cfg.Tokens == nil {
		cfg.Tokens = map[string]ServiceAccount{token: sa}
	}
	return Start(t, cfg)
}

// client dials s over TLS, verifying it with its roots; cert, when set, is
// offered as the client certificate.
func client(t *testing.T, s *Server, cert *tls.Certificate) pb.IstioCertificateServiceClient {
	t.Helper()
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: s.Roots(), ServerName: s.ServerName()}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	creds := credentials.NewTLS(tc)
	if s.cfg.Plaintext {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient("passthrough:///"+s.Addr(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pb.NewIstioCertificateServiceClient(conn)
}

func withToken(t *testing.T, tok string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

func csrPEM(t *testing.T, key crypto.Signer, tmpl *x509.CertificateRequest) string {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pki.EncodeCSRPEM(der))
}

func newKey(t *testing.T) crypto.Signer {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// goodCSR is a CSR for the identity of sa in s's trust domain.
func goodCSR(t *testing.T, s *Server, key crypto.Signer) string {
	t.Helper()
	der, err := pki.NewCSR(key, s.Identity(sa))
	if err != nil {
		t.Fatal(err)
	}
	return string(pki.EncodeCSRPEM(der))
}

func parse(t *testing.T, resp *pb.IstioCertificateResponse) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for _, s := range resp.GetCertChain() {
		certs, err := pki.ParseCertificates([]byte(s))
		if err != nil {
			t.Fatalf("answer does not parse: %v", err)
		}
		out = append(out, certs...)
	}
	return out
}

func TestIssuesForTheTokensServiceAccount(t *testing.T) {
	s := start(t, Config{TrustDomain: "example.org"})
	key := newKey(t)
	resp, err := client(t, s, nil).CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: goodCSR(t, s, key), ValidityDuration: 600})
	if err != nil {
		t.Fatal(err)
	}
	chain := parse(t, resp)
	if len(resp.GetCertChain()) != 3 || len(chain) != 3 {
		t.Fatalf("answer has %d strings and %d certificates, want 3 of each", len(resp.GetCertChain()), len(chain))
	}
	id := pki.SPIFFEIdentity("example.org", "shop", "app")
	if err := pki.VerifyIssued(chain, key.Public(), id, s.Roots(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := chain[0].NotAfter.Sub(chain[0].NotBefore); got != 10*time.Minute+time.Minute {
		t.Errorf("lifetime %v, want the requested 10 minutes plus a minute of back-dating", got)
	}
	if n := s.Requests(); n != 1 {
		t.Errorf("Requests() = %d, want 1", n)
	}
	if csrs := s.CSRs(); len(csrs) != 1 || csrs[0].Identity != id.String() || csrs[0].At.IsZero() {
		t.Errorf("CSRs() = %+v, want one for %s", csrs, id)
	}
}

func TestValidity(t *testing.T) {
	at := time.Now().Add(-3 * time.Hour).Truncate(time.Second)
	tests := []struct {
		name   string
		maxTTL time.Duration
		secs   int64
		want   time.Duration
	}{
		{"default", 0, 0, DefaultTTL},
		{"negative means default", 0, -5, DefaultTTL},
		{"requested", 0, 3600, time.Hour},
		{"capped", 30 * time.Minute, 3600, 30 * time.Minute},
		{"huge request capped", time.Hour, 1 << 62, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := start(t, Config{MaxTTL: tt.maxTTL, Now: func() time.Time { return at }})
			resp, err := client(t, s, nil).CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: goodCSR(t, s, newKey(t)), ValidityDuration: tt.secs})
			if err != nil {
				t.Fatal(err)
			}
			leaf := parse(t, resp)[0]
			if !leaf.NotBefore.Equal(at.Add(-time.Minute)) || !leaf.NotAfter.Equal(at.Add(tt.want)) {
				t.Errorf("validity %s..%s, want %s..%s", leaf.NotBefore, leaf.NotAfter, at.Add(-time.Minute), at.Add(tt.want))
			}
		})
	}
}

func TestAuthentication(t *testing.T) {
	s := start(t, Config{})
	other, err := localca.New(localca.Config{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	vmSA := ServiceAccount{Namespace: "vms", Name: "billing"}
	vmCert, err := s.CA().TLSCertificate(localca.Leaf{Identity: s.Identity(vmSA), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	foreignTD, err := s.CA().TLSCertificate(localca.Leaf{Identity: pki.SPIFFEIdentity("elsewhere.org", "vms", "billing"), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	untrusted, err := other.TLSCertificate(localca.Leaf{Identity: s.Identity(vmSA), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		token string
		cert  *tls.Certificate
		csrSA ServiceAccount
		code  codes.Code
	}{
		{"token", token, nil, sa, codes.OK},
		{"no credentials", "", nil, sa, codes.Unauthenticated},
		{"unknown token", "nope", nil, sa, codes.Unauthenticated},
		{"client certificate", "", &vmCert, vmSA, codes.OK},
		{"client certificate wins over token", token, &vmCert, vmSA, codes.OK},
		{"client certificate of another trust domain", "", &foreignTD, vmSA, codes.Unauthenticated},
		{"identity from the token, not the CSR", token, nil, vmSA, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := newKey(t)
			der, err := pki.NewCSR(key, s.Identity(tt.csrSA))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client(t, s, tt.cert).CreateCertificate(withToken(t, tt.token), &pb.IstioCertificateRequest{Csr: string(pki.EncodeCSRPEM(der))})
			if code := status.Code(err); code != tt.code {
				t.Fatalf("code %s (%v), want %s", code, err, tt.code)
			}
			if tt.code == codes.OK {
				if err := pki.VerifyIssued(parse(t, resp), key.Public(), s.Identity(tt.csrSA), s.Roots(), time.Now()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	t.Run("client certificate from another CA", func(t *testing.T) {
		_, err := client(t, s, &untrusted).CreateCertificate(withToken(t, ""), &pb.IstioCertificateRequest{Csr: goodCSR(t, s, newKey(t))})
		if err == nil {
			t.Fatal("a client certificate from an unknown CA was accepted")
		}
	})
}

func TestCSRRules(t *testing.T) {
	s := start(t, Config{})
	u, err := s.Identity(sa).URI()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := url.Parse("spiffe://cluster.local/ns/shop/sa/admin")
	tests := []struct {
		name string
		tmpl x509.CertificateRequest
	}{
		{"DNS name", x509.CertificateRequest{URIs: []*url.URL{u}, DNSNames: []string{"app.shop.svc"}}},
		{"IP", x509.CertificateRequest{URIs: []*url.URL{u}, IPAddresses: []net.IP{net.IPv4(10, 1, 2, 3)}}},
		{"email", x509.CertificateRequest{URIs: []*url.URL{u}, EmailAddresses: []string{"a@b"}}},
		{"common name", x509.CertificateRequest{URIs: []*url.URL{u}, Subject: pkix.Name{CommonName: "app"}}},
		{"no URI", x509.CertificateRequest{}},
		{"another URI", x509.CertificateRequest{URIs: []*url.URL{other}}},
		{"extra URI", x509.CertificateRequest{URIs: []*url.URL{u, other}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := client(t, s, nil).CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: csrPEM(t, newKey(t), &tt.tmpl)})
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument", err)
			}
		})
	}
	t.Run("bad signature", func(t *testing.T) {
		der, err := pki.NewCSR(newKey(t), s.Identity(sa))
		if err != nil {
			t.Fatal(err)
		}
		der[len(der)-3] ^= 0xff
		_, err = client(t, s, nil).CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: string(pki.EncodeCSRPEM(der))})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("error %v, want InvalidArgument", err)
		}
	})
	t.Run("not PEM", func(t *testing.T) {
		der, err := pki.NewCSR(newKey(t), s.Identity(sa))
		if err != nil {
			t.Fatal(err)
		}
		_, err = client(t, s, nil).CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: base64.StdEncoding.EncodeToString(der)})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("error %v, want InvalidArgument", err)
		}
	})
}

func TestModes(t *testing.T) {
	s := start(t, Config{})
	id := s.Identity(sa)
	tests := []struct {
		mode Mode
		want error // from pki.VerifyIssued; nil with code set means a gRPC error
		code codes.Code
	}{
		{ModeOK, nil, codes.OK},
		{ModeWrongSAN, pki.ErrIdentityMismatch, codes.OK},
		{ModeForeignChain, pki.ErrUntrustedChain, codes.OK},
		{ModeExpired, pki.ErrNotValidNow, codes.OK},
		{ModeWrongKey, pki.ErrKeyMismatch, codes.OK},
		{ModeGarbage, pki.ErrNoCertificates, codes.OK},
		{ModeError, nil, codes.PermissionDenied},
		{ModeLeafIsCA, pki.ErrLeafIsCA, codes.OK},
		{ModeNoDigitalSignature, pki.ErrKeyUsage, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			s.SetMode(tt.mode)
			s.SetError(codes.PermissionDenied)
			key := newKey(t)
			resp, err := client(t, s, nil).CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: goodCSR(t, s, key)})
			if code := status.Code(err); code != tt.code {
				t.Fatalf("code %s (%v), want %s", code, err, tt.code)
			}
			if tt.code != codes.OK {
				return
			}
			var chain []*x509.Certificate
			for _, str := range resp.GetCertChain() {
				certs, err := pki.ParseCertificates([]byte(str))
				if err != nil {
					if tt.mode != ModeGarbage {
						t.Fatalf("answer does not parse: %v", err)
					}
					return
				}
				chain = append(chain, certs...)
			}
			if tt.mode == ModeGarbage {
				t.Fatal("garbage answer parsed")
			}
			err = pki.VerifyIssued(chain, key.Public(), id, s.Roots(), time.Now())
			if (tt.want == nil && err != nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("VerifyIssued: %v, want %v", err, tt.want)
			}
		})
	}
}

func TestBundleChain(t *testing.T) {
	s := start(t, Config{BundleChain: true})
	key := newKey(t)
	resp, err := client(t, s, nil).CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: goodCSR(t, s, key)})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetCertChain()) != 1 {
		t.Fatalf("answer has %d strings, want 1", len(resp.GetCertChain()))
	}
	if err := pki.VerifyIssued(parse(t, resp), key.Public(), s.Identity(sa), s.Roots(), time.Now()); err != nil {
		t.Fatal(err)
	}
}

func TestFailNextThenMode(t *testing.T) {
	s := start(t, Config{})
	s.FailNext(2, codes.ResourceExhausted)
	c := client(t, s, nil)
	for i, want := range []codes.Code{codes.ResourceExhausted, codes.ResourceExhausted, codes.OK} {
		_, err := c.CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: goodCSR(t, s, newKey(t))})
		if code := status.Code(err); code != want {
			t.Fatalf("call %d: %s (%v), want %s", i, code, err, want)
		}
	}
}

func TestRecordsWhatArrived(t *testing.T) {
	s := start(t, Config{})
	if s.LastRequest() != nil || s.LastMetadata() != nil || s.Tokens() != nil {
		t.Fatal("records before any request")
	}
	ctx := metadata.AppendToOutgoingContext(withToken(t, "unknown"), "ClusterID", "c9")
	_, err := client(t, s, nil).CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: "x", ValidityDuration: 7})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("error %v, want Unauthenticated", err)
	}
	if got := s.LastMetadata().Get("clusterid"); len(got) != 1 || got[0] != "c9" {
		t.Errorf("clusterid %q, want c9", got)
	}
	if got := s.LastRequest().GetValidityDuration(); got != 7 {
		t.Errorf("validity %d, want 7", got)
	}
	if got := s.Tokens(); len(got) != 1 || got[0] != "Bearer unknown" {
		t.Errorf("tokens %q", got)
	}
	if s.Requests() != 1 {
		t.Errorf("Requests() = %d, want 1", s.Requests())
	}
}

func TestDelayRespectsTheCaller(t *testing.T) {
	s := start(t, Config{})
	s.SetDelay(10 * time.Second)
	ctx, cancel := context.WithTimeout(withToken(t, token), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := client(t, s, nil).CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: goodCSR(t, s, newKey(t))})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("error %v, want DeadlineExceeded", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Error("the delayed answer held the caller past its deadline")
	}
	s.SetDelay(50 * time.Millisecond)
	start = time.Now()
	if _, err := client(t, s, nil).CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: goodCSR(t, s, newKey(t))}); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed < 50*time.Millisecond {
		t.Errorf("answer came after %v, want at least the 50ms delay", elapsed)
	}
}

func TestStopAndRestartOnTheSameAddress(t *testing.T) {
	s := start(t, Config{})
	addr := s.Addr()
	s.Stop()
	s.Stop() // twice is fine
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatal("connection accepted while stopped")
	}
	s.Restart(t)
	if s.Addr() != addr {
		t.Fatalf("address changed from %s to %s", addr, s.Addr())
	}
	if _, err := client(t, s, nil).CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: goodCSR(t, s, newKey(t))}); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	s.Restart(t) // restarting a running server works too
	if _, err := client(t, s, nil).CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: goodCSR(t, s, newKey(t))}); err != nil {
		t.Fatalf("after second restart: %v", err)
	}
}

func TestSetServingCert(t *testing.T) {
	s := start(t, Config{})
	cert, err := s.CA().ServerTLS([]string{"impostor.example"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetServingCert(cert)
	_, err = client(t, s, nil).CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: goodCSR(t, s, newKey(t))})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("error %v, want Unavailable from a failed handshake", err)
	}
	if s.Requests() != 0 || len(s.Tokens()) != 0 {
		t.Errorf("requests %d, tokens %q after a failed handshake; want none", s.Requests(), s.Tokens())
	}
}

func TestPlaintextAndAddToken(t *testing.T) {
	s := start(t, Config{Plaintext: true})
	s.AddToken("late", ServiceAccount{Namespace: "ops", Name: "job"})
	key := newKey(t)
	der, err := pki.NewCSR(key, pki.SPIFFEIdentity("cluster.local", "ops", "job"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client(t, s, nil).CreateCertificate(withToken(t, "late"), &pb.IstioCertificateRequest{Csr: string(pki.EncodeCSRPEM(der))})
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.VerifyIssued(parse(t, resp), key.Public(), pki.SPIFFEIdentity("cluster.local", "ops", "job"), s.Roots(), time.Now()); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentRequests(t *testing.T) {
	s := start(t, Config{})
	c := client(t, s, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%5 == 0 {
				s.SetDelay(time.Millisecond)
			}
			key, err := pki.GenerateKey(pki.ECP256)
			if err != nil {
				errs <- err
				return
			}
			der, err := pki.NewCSR(key, s.Identity(sa))
			if err != nil {
				errs <- err
				return
			}
			ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token), 10*time.Second)
			defer cancel()
			_, err = c.CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: string(pki.EncodeCSRPEM(der))})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if s.Requests() != 20 {
		t.Errorf("Requests() = %d, want 20", s.Requests())
	}
}

func TestModeString(t *testing.T) {
	if ModeForeignChain.String() != "foreign-chain" || Mode(42).String() != "mode(42)" {
		t.Errorf("mode names: %s, %s", ModeForeignChain, Mode(42))
	}
}

func TestInFlightAndAnswers(t *testing.T) {
	s := start(t, Config{TrustDomain: "example.org"})
	c := client(t, s, nil)
	s.SetDelay(time.Hour) // held until their callers give up
	ctx, cancel := context.WithCancel(withToken(t, token))
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = c.CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: goodCSR(t, s, newKey(t))})
		}()
	}
	testwait.For(t, "3 calls held by the server", func() bool { return s.Requests() >= 3 })
	if got := s.MaxInFlight(); got != 3 {
		t.Errorf("MaxInFlight() = %d with 3 calls held, want 3", got)
	}
	for _, r := range s.CSRs() {
		if !r.Answered.IsZero() {
			t.Errorf("a held call is marked answered: %+v", r)
		}
	}
	cancel()
	wg.Wait()
	// The server sees the cancellations a moment after the callers do.
	testwait.Within(t, 5*time.Second, "the 3 cancelled calls answered", func() bool {
		answered := 0
		for _, r := range s.CSRs() {
			if !r.Answered.IsZero() {
				answered++
			}
		}
		return answered == 3
	})
	s.SetDelay(0)
	if _, err := c.CreateCertificate(withToken(t, token), &pb.IstioCertificateRequest{Csr: goodCSR(t, s, newKey(t))}); err != nil {
		t.Fatal(err)
	}
	csrs := s.CSRs()
	if len(csrs) != 4 {
		t.Fatalf("%d CSRs recorded, want 4", len(csrs))
	}
	for i, r := range csrs {
		if r.Answered.IsZero() || r.Answered.Before(r.At) || r.Issued != (i == 3) {
			t.Errorf("CSR %d = %+v, want answered after it arrived, issued only for the last", i, r)
		}
	}
	if got := s.MaxInFlight(); got != 3 {
		t.Errorf("MaxInFlight() = %d after the calls, want still 3", got)
	}
}

// RefuseIdentity refuses one identity's CSRs and serves the others'.
func TestRefuseIdentity(t *testing.T) {
	other := ServiceAccount{Namespace: "shop", Name: "other"}
	s := start(t, Config{Tokens: map[string]ServiceAccount{token: sa, "tok-other": other}})
	c := client(t, s, nil)
	ask := func(tok string, who ServiceAccount) error {
		der, err := pki.NewCSR(newKey(t), s.Identity(who))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.CreateCertificate(withToken(t, tok), &pb.IstioCertificateRequest{Csr: string(pki.EncodeCSRPEM(der))})
		return err
	}
	s.RefuseIdentity(s.Identity(sa).SPIFFEID, codes.PermissionDenied)
	if err := ask(token, sa); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("refused identity: %v, want PermissionDenied", err)
	}
	if err := ask("tok-other", other); err != nil {
		t.Fatalf("another identity: %v", err)
	}
	s.RefuseIdentity(s.Identity(sa).SPIFFEID, codes.OK)
	if err := ask(token, sa); err != nil {
		t.Fatalf("after the refusal was lifted: %v", err)
	}
}

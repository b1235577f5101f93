package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/istioca"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testToken = "transport-test-token"

var testSA = istioca.ServiceAccount{Namespace: "shop", Name: "app"}

// countingFetcher hands out a fixed token and counts how often it was asked.
type countingFetcher struct {
	tok   string
	err   error
	calls atomic.Int32
}

func (f *countingFetcher) Token(context.Context) (string, error) {
	f.calls.Add(1)
	return f.tok, f.err
}

func TestCallCredsRefusesTokenToUnverifiedRemotePeer(t *testing.T) {
	f := &countingFetcher{tok: testToken}
	c := &callCreds{token: f, md: map[string]string{"ClusterID": "c1"}, loopback: false}
	// A context without RequestInfo stands for a connection with no TLS
	// handshake behind it (plaintext to a remote address).
	md, err := c.GetRequestMetadata(context.Background())
	if !errors.Is(err, ErrUnverifiedPeer) {
		t.Fatalf("GetRequestMetadata = %v, %v; want ErrUnverifiedPeer", md, err)
	}
	if md != nil {
		t.Errorf("metadata %v returned with the refusal", md)
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("token fetched %d times, want 0: it must not even be read", n)
	}
}

func TestCallCredsLoopbackPlaintextSendsToken(t *testing.T) {
	f := &countingFetcher{tok: testToken}
	c := &callCreds{token: f, md: map[string]string{"ClusterID": "c1", "X-Extra": "v"}, loopback: true}
	md, err := c.GetRequestMetadata(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"clusterid": "c1", "x-extra": "v", "authorization": "Bearer " + testToken}
	if len(md) != len(want) {
		t.Fatalf("metadata %v, want %v", md, want)
	}
	for k, v := range want {
		if md[k] != v {
			t.Errorf("metadata %s = %q, want %q", k, md[k], v)
		}
	}
}

func TestCallCredsWithoutTokenSendsMetadataAnywhere(t *testing.T) {
	c := &callCreds{md: map[string]string{"ClusterID": "c1"}}
	md, err := c.GetRequestMetadata(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if md["clusterid"] != "c1" || len(md) != 1 {
		t.Errorf("metadata %v, want only clusterid", md)
	}
	if c.RequireTransportSecurity() {
		t.Error("RequireTransportSecurity is true; loopback plaintext must stay possible")
	}
}

func TestCallCredsTokenErrorIsWrapped(t *testing.T) {
	c := &callCreds{token: credfetcher.File{Path: filepath.Join(t.TempDir(), "missing")}, loopback: true}
	_, err := c.GetRequestMetadata(context.Background())
	if !errors.Is(err, credfetcher.ErrNoToken) {
		t.Fatalf("error %v, want one wrapping credfetcher.ErrNoToken", err)
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:15012":               true,
		"127.0.0.2:1":                   true,
		"[::1]:15012":                   true,
		"::1":                           true,
		"localhost:15012":               true,
		"localhost":                     true,
		"unix:///var/run/ca.sock":       true,
		"/var/run/ca.sock":              true,
		"10.0.0.1:15012":                false,
		"192.168.1.1:15012":             false,
		"istiod.istio-system.svc:15012": false,
		"localhost.example.com:1":       false,
		"":                              false,
	} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestTarget(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:1":      "passthrough:///127.0.0.1:1",
		"dns:///istiod:1":  "dns:///istiod:1",
		"unix:///tmp/sock": "unix:///tmp/sock",
	} {
		if got := target(addr); got != want {
			t.Errorf("target(%q) = %q, want %q", addr, got, want)
		}
	}
}

func TestDialNeedsAnAddress(t *testing.T) {
	if _, err := Dial(Config{}); err == nil {
		t.Fatal("Dial without an address succeeded")
	}
}

func TestServerNameDefaultsToHost(t *testing.T) {
	for addr, want := range map[string]string{
		"istiod.istio-system.svc:15012": "istiod.istio-system.svc",
		"127.0.0.1:1":                   "127.0.0.1",
		"[::1]:1":                       "::1",
		"no-port":                       "no-port",
	} {
		if got := (Config{Addr: addr}).serverName(); got != want {
			t.Errorf("serverName for %q = %q, want %q", addr, got, want)
		}
	}
	if got := (Config{Addr: "a:1", ServerName: "b"}).serverName(); got != "b" {
		t.Errorf("explicit ServerName lost: %q", got)
	}
}

// call makes one CreateCertificate call over conn for a fresh key.
func call(ctx context.Context, t *testing.T, conn *grpc.ClientConn, ca *istioca.Server, opts ...grpc.CallOption) error {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, ca.Identity(testSA))
	if err != nil {
		t.Fatal(err)
	}
	_, err = pb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: string(pki.EncodeCSRPEM(csr))}, opts...)
	return err
}

func dial(t *testing.T, cfg Config) *grpc.ClientConn {
	t.Helper()
	conn, err := Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func startCA(t *testing.T, cfg istioca.Config) *istioca.Server {
	t.Helper()
	cfg.Tokens = map[string]istioca.ServiceAccount{testToken: testSA}
	return istioca.Start(t, cfg)
}

func tokenFile(t *testing.T) credfetcher.File {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(testToken), 0o600); err != nil {
		t.Fatal(err)
	}
	return credfetcher.File{Path: p}
}

func TestTLSPeerVerification(t *testing.T) {
	foreign, err := localca.New(localca.Config{Name: "foreign"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		serverName string
		roots      func(ca *istioca.Server) RootSource
		ok         bool
	}{
		{"expected name", istioca.DefaultServerName, func(ca *istioca.Server) RootSource { return StaticRoots{Pool: ca.Roots()} }, true},
		{"name defaults to the IP host", "", func(ca *istioca.Server) RootSource { return StaticRoots{Pool: ca.Roots()} }, true},
		{"unexpected name", "istiod.other-ns.svc", func(ca *istioca.Server) RootSource { return StaticRoots{Pool: ca.Roots()} }, false},
		{"untrusted root", istioca.DefaultServerName, func(*istioca.Server) RootSource { return StaticRoots{Pool: foreign.Pool()} }, false},
		{"system roots", istioca.DefaultServerName, func(*istioca.Server) RootSource { return nil }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ca := startCA(t, istioca.Config{})
			conn := dial(t, Config{
				Addr:       ca.Addr(),
				ServerName: tt.serverName,
				Roots:      tt.roots(ca),
				Token:      tokenFile(t),
				Metadata:   map[string]string{"ClusterID": "Kubernetes"},
			})
			err := call(testCtx(t), t, conn, ca)
			if tt.ok {
				if err != nil {
					t.Fatalf("call: %v", err)
				}
				md := ca.LastMetadata()
				if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+testToken {
					t.Errorf("authorization %q, want the bearer token", got)
				}
				if got := md.Get("clusterid"); len(got) != 1 || got[0] != "Kubernetes" {
					t.Errorf("clusterid %q, want Kubernetes", got)
				}
				return
			}
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "verifying peer") {
				t.Fatalf("call error %v, want Unavailable from the peer check", err)
			}
			if n := ca.Requests(); n != 0 {
				t.Errorf("CA received %d requests, want 0", n)
			}
			if toks := ca.Tokens(); len(toks) != 0 {
				t.Errorf("CA received tokens %q, want none", toks)
			}
		})
	}
}

func TestRootRotationAppliesToNewHandshakes(t *testing.T) {
	oldCA, err := localca.New(localca.Config{Name: "old root", Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := localca.New(localca.Config{Name: "new root", Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	ca := startCA(t, istioca.Config{CA: oldCA})
	roots := &swapRoots{}
	roots.Set(oldCA.Pool())
	cfg := Config{Addr: ca.Addr(), ServerName: ca.ServerName(), Roots: roots, Token: tokenFile(t)}
	conn := dial(t, cfg)
	if err := call(testCtx(t), t, conn, ca); err != nil {
		t.Fatalf("call before rotation: %v", err)
	}

	// The CA moves to a serving certificate from the new root; existing
	// connections are cut so the next call needs a new handshake.
	serving, err := newCA.ServerTLS([]string{ca.ServerName()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca.SetServingCert(serving)
	ca.Restart(t)
	if err := call(testCtx(t), t, dial(t, cfg), ca); err == nil || !strings.Contains(err.Error(), "verifying peer") {
		t.Fatalf("call with only the old root: %v, want a peer verification failure", err)
	}
	before := ca.Requests()

	// A connection made before the swap verifies with the roots in force at
	// its handshake.
	later := dial(t, cfg)
	roots.Set(pki.CertPool([]*x509.Certificate{oldCA.Root(), newCA.Root()}))
	if err := call(testCtx(t), t, later, ca); err != nil {
		t.Fatalf("call after the root swap: %v", err)
	}
	// The first connection recovers on its own once it reconnects.
	if err := call(testCtx(t), t, conn, ca, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("call on the first connection after the root swap: %v", err)
	}
	if got := ca.Requests() - before; got != 2 {
		t.Errorf("CA received %d requests after the swap, want 2", got)
	}
}

func TestClientCertificateIsAskedAtEveryHandshake(t *testing.T) {
	ca := startCA(t, istioca.Config{})
	vm := ca.Identity(istioca.ServiceAccount{Namespace: "vms", Name: "billing"})
	cert, err := ca.CA().TLSCertificate(localca.Leaf{Identity: vm, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int32
	var fail atomic.Bool
	cfg := Config{
		Addr:       ca.Addr(),
		ServerName: ca.ServerName(),
		Roots:      StaticRoots{Pool: ca.Roots()},
		ClientCertificate: func() (*tls.Certificate, error) {
			asked.Add(1)
			if fail.Load() {
				return nil, errors.New("no certificate yet")
			}
			return &cert, nil
		},
	}
	for i := range 2 {
		key, err := pki.GenerateKey(pki.ECP256)
		if err != nil {
			t.Fatal(err)
		}
		csr, err := pki.NewCSR(key, vm)
		if err != nil {
			t.Fatal(err)
		}
		_, err = pb.NewIstioCertificateServiceClient(dial(t, cfg)).CreateCertificate(testCtx(t), &pb.IstioCertificateRequest{Csr: string(pki.EncodeCSRPEM(csr))})
		if err != nil {
			t.Fatalf("call %d with a client certificate: %v", i, err)
		}
	}
	if n := asked.Load(); n != 2 {
		t.Errorf("client certificate asked %d times, want once per handshake (2)", n)
	}
	// Without a certificate the handshake still completes, and the CA
	// decides: no token either, so Unauthenticated.
	fail.Store(true)
	if err := call(testCtx(t), t, dial(t, cfg), ca); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("call without a client certificate: %v, want Unauthenticated", err)
	}
}

func TestPlaintextLoopbackCarriesTokenAndRemoteWouldNot(t *testing.T) {
	ca := startCA(t, istioca.Config{Plaintext: true})
	conn := dial(t, Config{Addr: ca.Addr(), Plaintext: true, Token: tokenFile(t)})
	if err := call(testCtx(t), t, conn, ca); err != nil {
		t.Fatalf("plaintext call over loopback: %v", err)
	}
	if toks := ca.Tokens(); len(toks) != 1 || toks[0] != "Bearer "+testToken {
		t.Errorf("tokens %q, want the token once", toks)
	}
	// The same configuration for a remote address builds credentials that
	// refuse the token (checked without sending anything).
	cfg := Config{Addr: net.JoinHostPort("istiod.istio-system.svc", "15010"), Plaintext: true, Token: tokenFile(t)}
	creds := &callCreds{token: cfg.Token, loopback: IsLoopback(cfg.Addr)}
	if _, err := creds.GetRequestMetadata(context.Background()); !errors.Is(err, ErrUnverifiedPeer) {
		t.Errorf("remote plaintext token: %v, want ErrUnverifiedPeer", err)
	}
}

// swapRoots is a RootSource whose pool a test replaces, as the agent's
// watched root bundle does.
type swapRoots struct{ p atomic.Pointer[x509.CertPool] }

func (s *swapRoots) Roots() *x509.CertPool   { return s.p.Load() }
func (s *swapRoots) Set(pool *x509.CertPool) { s.p.Store(pool) }

// TestClientCertificateOnlyOfAnIssuerThePeerAccepts: a peer that names the
// CAs it accepts (istiod names the roots it started with) is offered no
// certificate of another root, which would fail the handshake: the call goes
// out with the token alone and succeeds. A certificate of a root it names is
// offered and authenticates the caller.
func TestClientCertificateOnlyOfAnIssuerThePeerAccepts(t *testing.T) {
	ca := startCA(t, istioca.Config{})
	other, err := localca.New(localca.Config{Name: "rotated root", Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	vm := ca.Identity(istioca.ServiceAccount{Namespace: "vms", Name: "billing"})
	foreign, err := other.TLSCertificate(localca.Leaf{Identity: vm, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	own, err := ca.CA().TLSCertificate(localca.Leaf{Identity: vm, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var offer atomic.Pointer[tls.Certificate]
	cfg := Config{
		Addr: ca.Addr(), ServerName: ca.ServerName(), Roots: StaticRoots{Pool: ca.Roots()},
		Token:             tokenFile(t),
		ClientCertificate: func() (*tls.Certificate, error) { return offer.Load(), nil },
	}
	offer.Store(&foreign)
	if err := call(testCtx(t), t, dial(t, cfg), ca); err != nil {
		t.Fatalf("call holding a certificate of a root the CA does not accept: %v, want the token to authenticate it", err)
	}
	offer.Store(&own)
	cfg.Token = nil
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, vm)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewIstioCertificateServiceClient(dial(t, cfg)).CreateCertificate(testCtx(t), &pb.IstioCertificateRequest{Csr: string(pki.EncodeCSRPEM(csr))}); err != nil {
		t.Fatalf("call with a certificate of the CA's root and no token: %v", err)
	}
}

// TestRefusedCertificateLeavesTheNextHandshakeToTheToken: a root rotated to
// one with the old root's subject. The peer names that subject among the CAs
// it accepts, so the certificate of the new root is offered, and the peer,
// which holds the old root, refuses it. The next connection offers none and
// the token authenticates the call; the one after offers the certificate
// again. Without a token the certificate is offered at every handshake: it
// is all the caller has.
// refusalTestConn dials as the CA clients' connection does: one
// configuration shared by its redials (SharingRefusals), a connection
// dropped after a failed call so the next call dials afresh.
type refusalTestConn struct {
	cfg Config
	cc  *grpc.ClientConn
}

func newRefusalTestConn(cfg Config) *refusalTestConn {
	return &refusalTestConn{cfg: cfg.SharingRefusals()}
}

func (c *refusalTestConn) Get() (*grpc.ClientConn, error) {
	if c.cc == nil {
		cc, err := Dial(c.cfg)
		if err != nil {
			return nil, err
		}
		c.cc = cc
	}
	return c.cc, nil
}

func (c *refusalTestConn) Retire(cc *grpc.ClientConn, err error) {
	if err != nil && cc == c.cc {
		_ = c.cc.Close()
		c.cc = nil
	}
}

func (c *refusalTestConn) Close() error {
	if c.cc == nil {
		return nil
	}
	return c.cc.Close()
}

func TestRefusedCertificateLeavesTheNextHandshakeToTheToken(t *testing.T) {
	ca := startCA(t, istioca.Config{})
	sameName, err := localca.New(localca.Config{Name: ca.CA().Root().Subject.CommonName, Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sameName.Root().RawSubject, ca.CA().Root().RawSubject) {
		t.Fatalf("the rotated root's subject %v differs from the CA's %v", sameName.Root().Subject, ca.CA().Root().Subject)
	}
	vm := ca.Identity(istioca.ServiceAccount{Namespace: "vms", Name: "billing"})
	rotated, err := sameName.TLSCertificate(localca.Leaf{Identity: vm, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var offered atomic.Int32
	cfg := Config{
		Addr: ca.Addr(), ServerName: ca.ServerName(), Roots: StaticRoots{Pool: ca.Roots()},
		Token: tokenFile(t),
		ClientCertificate: func() (*tls.Certificate, error) {
			offered.Add(1)
			return &rotated, nil
		},
	}
	// attempt is one call as the CA clients make it: on the connection of
	// a Conn, retired after a failure so the next attempt dials afresh.
	attempt := func(conn *refusalTestConn) error {
		c, err := conn.Get()
		if err != nil {
			t.Fatal(err)
		}
		err = call(testCtx(t), t, c, ca)
		conn.Retire(c, err)
		return err
	}
	conn := newRefusalTestConn(cfg)
	t.Cleanup(func() { _ = conn.Close() })
	if err := attempt(conn); status.Code(err) != codes.Unavailable {
		t.Fatalf("first attempt, the certificate offered: %v, want the handshake refused", err)
	}
	tokensBefore := len(ca.Tokens())
	if err := attempt(conn); err != nil {
		t.Fatalf("second attempt: %v, want the token to authenticate it", err)
	}
	if n := len(ca.Tokens()) - tokensBefore; n != 1 {
		t.Errorf("the CA saw %d tokens on the second attempt, want 1", n)
	}
	// The refusal is forgotten once used: a new connection offers the
	// certificate again (istiod may have restarted with the new root).
	again := newRefusalTestConn(cfg)
	t.Cleanup(func() { _ = again.Close() })
	if err := attempt(again); status.Code(err) != codes.Unavailable {
		t.Fatalf("a new connection: %v, want the certificate offered and refused", err)
	}

	// No token: the certificate at every handshake.
	cfg.Token = nil
	bare := newRefusalTestConn(cfg)
	t.Cleanup(func() { _ = bare.Close() })
	before := offered.Load()
	for i := range 2 {
		if err := attempt(bare); status.Code(err) != codes.Unavailable {
			t.Fatalf("attempt %d without a token: %v, want the certificate offered and refused", i, err)
		}
	}
	if n := offered.Load() - before; n != 2 {
		t.Errorf("certificate asked for %d times in two attempts without a token, want 2", n)
	}
}

package istio

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/kubeenv"
)

// kube is the package's API server, started by the first test that needs it.
var kube = &kubeenv.Shared{}

func TestMain(m *testing.M) {
	os.Exit(kube.Main(m))
}

const (
	tokenA = "token-of-app"
	tokenB = "second-token-of-app"
)

var appSA = istioca.ServiceAccount{Namespace: "shop", Name: "app"}

// startCA serves a test CA that knows tokenA and tokenB as appSA.
func startCA(t *testing.T, cfg istioca.Config) *istioca.Server {
	t.Helper()
	if cfg.Tokens == nil {
		cfg.Tokens = map[string]istioca.ServiceAccount{tokenA: appSA, tokenB: appSA}
	}
	return istioca.Start(t, cfg)
}

func writeToken(t *testing.T, path, tok string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

type env struct {
	ca        *istioca.Server
	client    *Client
	tokenPath string
	reg       *prometheus.Registry
	cfg       Config
}

// newEnv starts a CA and a client of it with a token file holding tokenA.
// edit, when set, changes the client configuration before New.
func newEnv(t *testing.T, caCfg istioca.Config, edit func(*Config)) *env {
	t.Helper()
	ca := startCA(t, caCfg)
	tokenPath := filepath.Join(t.TempDir(), "istio-token")
	writeToken(t, tokenPath, tokenA)
	reg := prometheus.NewRegistry()
	cfg := Config{
		Transport: controlplane.Config{
			Addr:       ca.Addr(),
			ServerName: ca.ServerName(),
			Roots:      controlplane.StaticRoots{Pool: ca.Roots()},
			Token:      credfetcher.File{Path: tokenPath},
			Metadata:   map[string]string{"ClusterID": "Kubernetes", "X-Tenant": "blue"},
		},
		CertSigner: "signer-a",
		Registerer: reg,
	}
	if edit != nil {
		edit(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &env{ca: ca, client: c, tokenPath: tokenPath, reg: reg, cfg: cfg}
}

func newCSR(t testing.TB, id pki.Identity) (crypto.Signer, []byte) {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	return key, csr
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func requestsWith(e *env, result string) float64 {
	return testutil.ToFloat64(e.client.metrics.requests.WithLabelValues(result))
}

func TestSignIssuesVerifiableChain(t *testing.T) {
	for _, bundle := range []bool{false, true} {
		name := "one string per certificate"
		if bundle {
			name = "whole chain in one string"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, istioca.Config{BundleChain: bundle}, nil)
			id := e.ca.Identity(appSA)
			key, csr := newCSR(t, id)
			chain, err := e.client.Sign(ctxT(t), csr, id, time.Hour)
			if err != nil {
				t.Fatalf("Sign: %v", err)
			}
			if len(chain) != 3 {
				t.Fatalf("chain has %d certificates, want leaf, intermediate and root", len(chain))
			}
			if err := pki.VerifyIssued(chain, key.Public(), id, e.ca.Roots(), time.Now()); err != nil {
				t.Fatalf("VerifyIssued: %v", err)
			}
			if got := chain[0].NotAfter.Sub(chain[0].NotBefore); got != time.Hour+time.Minute {
				t.Errorf("leaf lifetime %v, want the requested hour (plus the CA's minute of back-dating)", got)
			}
			req := e.ca.LastRequest()
			if req.GetValidityDuration() != 3600 {
				t.Errorf("validity_duration %d, want 3600", req.GetValidityDuration())
			}
			if got := req.GetMetadata().GetFields()[CertSignerKey].GetStringValue(); got != "signer-a" {
				t.Errorf("CertSigner metadata %q, want signer-a", got)
			}
			if got := requestsWith(e, resultOK); got != 1 {
				t.Errorf("requests{result=ok} = %v, want 1", got)
			}
			if n, err := testutil.GatherAndCount(e.reg, "meshagent_ca_request_duration_seconds"); err != nil || n != 1 {
				t.Errorf("latency histogram series = %d (%v), want 1", n, err)
			}
		})
	}
}

func TestNoCertSignerMetadataWhenUnset(t *testing.T) {
	e := newEnv(t, istioca.Config{}, func(c *Config) { c.CertSigner = "" })
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); err != nil {
		t.Fatal(err)
	}
	if md := e.ca.LastRequest().GetMetadata(); md != nil {
		t.Errorf("request metadata %v, want none", md)
	}
}

func TestMetadataAndTokenArrive(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); err != nil {
		t.Fatal(err)
	}
	md := e.ca.LastMetadata()
	for key, want := range map[string]string{
		"clusterid":     "Kubernetes",
		"x-tenant":      "blue",
		"authorization": "Bearer " + tokenA,
	} {
		if got := md.Get(key); len(got) != 1 || got[0] != want {
			t.Errorf("metadata %s = %q, want [%q]", key, got, want)
		}
	}
}

func TestTokenIsReadAfreshForEveryRequest(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); err != nil {
		t.Fatal(err)
	}
	writeToken(t, e.tokenPath, tokenB)
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); err != nil {
		t.Fatal(err)
	}
	got := e.ca.Tokens()
	want := []string{"Bearer " + tokenA, "Bearer " + tokenB}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("CA received tokens %q, want %q", got, want)
	}
}

func TestMissingTokenFileFailsWithoutContactingTheCA(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	if err := os.Remove(e.tokenPath); err != nil {
		t.Fatal(err)
	}
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	_, err := e.client.Sign(ctxT(t), csr, id, time.Hour)
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Sign error %v, want one naming the missing token file", err)
	}
	if n := e.ca.Requests(); n != 0 {
		t.Errorf("CA received %d requests, want 0", n)
	}
}

func TestUnknownTokenIsUnauthenticated(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	writeToken(t, e.tokenPath, "stolen-or-stale")
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	_, err := e.client.Sign(ctxT(t), csr, id, time.Hour)
	if code := status.Code(err); code != codes.Unauthenticated {
		t.Fatalf("Sign error %v (code %s), want Unauthenticated", err, code)
	}
	if n := e.ca.Requests(); n != 1 {
		t.Errorf("CA received %d requests, want 1 (no retry)", n)
	}
	if got := requestsWith(e, "unauthenticated"); got != 1 {
		t.Errorf("requests{result=unauthenticated} = %v, want 1", got)
	}
}

// One Sign is one CSR whatever the CA answers: retries belong to the caller.
func TestOneRequestPerSign(t *testing.T) {
	for _, code := range []codes.Code{
		codes.Unavailable, codes.Internal, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted,
		codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition, codes.Unknown,
	} {
		t.Run(code.String(), func(t *testing.T) {
			e := newEnv(t, istioca.Config{}, nil)
			e.ca.FailNext(1, code)
			id := e.ca.Identity(appSA)
			_, csr := newCSR(t, id)
			if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); status.Code(err) != code {
				t.Fatalf("Sign error %v (code %s), want %s", err, status.Code(err), code)
			}
			if n := e.ca.Requests(); n != 1 {
				t.Fatalf("CA received %d requests for one Sign, want 1", n)
			}
			// The next Sign (the caller's retry) goes out on a fresh connection.
			key, csr := newCSR(t, id)
			chain, err := e.client.Sign(ctxT(t), csr, id, time.Hour)
			if err != nil {
				t.Fatalf("Sign after a failure: %v", err)
			}
			if err := pki.VerifyIssued(chain, key.Public(), id, e.ca.Roots(), time.Now()); err != nil {
				t.Fatal(err)
			}
			if n := e.ca.Requests(); n != 2 {
				t.Errorf("CA received %d requests for two Signs, want 2", n)
			}
		})
	}
}

func TestUnavailableIsCountedPerCall(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	e.ca.FailNext(3, codes.Unavailable)
	id := e.ca.Identity(appSA)
	for i := range 3 {
		_, csr := newCSR(t, id)
		if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); status.Code(err) != codes.Unavailable {
			t.Fatalf("Sign %d: %v, want Unavailable", i, err)
		}
	}
	key, csr := newCSR(t, id)
	chain, err := e.client.Sign(ctxT(t), csr, id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.VerifyIssued(chain, key.Public(), id, e.ca.Roots(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if n := e.ca.Requests(); n != 4 {
		t.Errorf("CA received %d requests, want 4", n)
	}
	if got := requestsWith(e, "unavailable"); got != 3 {
		t.Errorf("requests{result=unavailable} = %v, want 3", got)
	}
	if got := requestsWith(e, resultOK); got != 1 {
		t.Errorf("requests{result=ok} = %v, want 1", got)
	}
}

// csrWith makes a CSR for id that also asks for extra names.
func csrWith(t *testing.T, id pki.Identity, tmpl x509.CertificateRequest) []byte {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	u, err := id.URI()
	if err != nil {
		t.Fatal(err)
	}
	tmpl.URIs = append(tmpl.URIs, u)
	der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func TestNoRetryOnCSRTheCARejects(t *testing.T) {
	tests := []struct {
		name string
		tmpl x509.CertificateRequest
	}{
		{"DNS name", x509.CertificateRequest{DNSNames: []string{"app.shop.svc"}}},
		{"IP address", x509.CertificateRequest{IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}},
		{"email", x509.CertificateRequest{EmailAddresses: []string{"app@shop"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, istioca.Config{}, nil)
			id := e.ca.Identity(appSA)
			_, err := e.client.Sign(ctxT(t), csrWith(t, id, tt.tmpl), id, time.Hour)
			if code := status.Code(err); code != codes.InvalidArgument {
				t.Fatalf("Sign error %v, want InvalidArgument", err)
			}
			if n := e.ca.Requests(); n != 1 {
				t.Errorf("CA received %d requests, want 1 (no retry)", n)
			}
		})
	}
}

func TestCSRForAnotherIdentityIsRejected(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	other := e.ca.Identity(istioca.ServiceAccount{Namespace: "bank", Name: "vault"})
	_, csr := newCSR(t, other)
	_, err := e.client.Sign(ctxT(t), csr, other, time.Hour)
	if code := status.Code(err); code != codes.InvalidArgument {
		t.Fatalf("Sign error %v, want InvalidArgument: the identity comes from the token", err)
	}
}

func TestCallerContextEndsTheCall(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	e.ca.SetDelay(10 * time.Second)
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := e.client.Sign(ctx, csr, id, time.Hour)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Sign error %v, want one wrapping context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("Sign took %v after its context ended", elapsed)
	}
	if n := e.ca.Requests(); n > 1 {
		t.Errorf("CA received %d requests, want at most 1 (no retry once the caller gave up)", n)
	}
}

func TestAttemptTimeoutEndsTheCall(t *testing.T) {
	e := newEnv(t, istioca.Config{}, func(c *Config) { c.AttemptTimeout = 100 * time.Millisecond })
	e.ca.SetDelay(10 * time.Second)
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	_, err := e.client.Sign(ctxT(t), csr, id, time.Hour)
	if code := status.Code(err); code != codes.DeadlineExceeded {
		t.Fatalf("Sign error %v, want DeadlineExceeded", err)
	}
	if n := e.ca.Requests(); n != 1 {
		t.Errorf("CA received %d requests, want 1", n)
	}
}

func TestUnexpectedServerNameSendsNothing(t *testing.T) {
	foreign, err := localca.New(localca.Config{Name: "foreign"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		serving func(ca *istioca.Server) (tls.Certificate, error)
	}{
		{"name not in certificate", func(ca *istioca.Server) (tls.Certificate, error) {
			return ca.CA().ServerTLS([]string{"impostor.example"}, nil)
		}},
		{"right name, untrusted root", func(ca *istioca.Server) (tls.Certificate, error) {
			return foreign.ServerTLS([]string{ca.ServerName()}, []net.IP{net.IPv4(127, 0, 0, 1)})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, istioca.Config{}, nil)
			cert, err := tt.serving(e.ca)
			if err != nil {
				t.Fatal(err)
			}
			e.ca.SetServingCert(cert)
			id := e.ca.Identity(appSA)
			_, csr := newCSR(t, id)
			_, err = e.client.Sign(ctxT(t), csr, id, time.Hour)
			if err == nil {
				t.Fatal("Sign succeeded against a CA with the wrong TLS identity")
			}
			if !strings.Contains(err.Error(), "verifying peer") {
				t.Errorf("Sign error %v, want a handshake verification failure", err)
			}
			if n := e.ca.Requests(); n != 0 {
				t.Errorf("CA received %d requests, want 0", n)
			}
			if toks := e.ca.Tokens(); len(toks) != 0 {
				t.Errorf("CA received tokens %q, want none", toks)
			}
		})
	}
}

func TestClientCertificateAuthWithoutToken(t *testing.T) {
	ca := startCA(t, istioca.Config{})
	vm := istioca.ServiceAccount{Namespace: "vms", Name: "billing"}
	vmID := ca.Identity(vm)
	prov, err := ca.CA().TLSCertificate(localca.Leaf{Identity: vmID, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{
		Transport: controlplane.Config{
			Addr:       ca.Addr(),
			ServerName: ca.ServerName(),
			Roots:      controlplane.StaticRoots{Pool: ca.Roots()},
			ClientCertificate: func() (*tls.Certificate, error) {
				return &prov, nil
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key, csr := newCSR(t, vmID)
	chain, err := c.Sign(ctxT(t), csr, vmID, time.Hour)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	if err := pki.VerifyIssued(chain, key.Public(), vmID, ca.Roots(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if toks := ca.Tokens(); len(toks) != 0 {
		t.Errorf("CA received tokens %q, want none", toks)
	}
	// The identity comes from the client certificate, not from the CSR.
	other := ca.Identity(appSA)
	_, csr = newCSR(t, other)
	if _, err := c.Sign(ctxT(t), csr, other, time.Hour); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Sign for another identity: %v, want InvalidArgument", err)
	}
}

func TestPlaintextLoopbackSendsToken(t *testing.T) {
	e := newEnv(t, istioca.Config{Plaintext: true}, func(c *Config) {
		c.Transport.Plaintext = true
		c.Transport.Roots = nil
	})
	id := e.ca.Identity(appSA)
	key, csr := newCSR(t, id)
	chain, err := e.client.Sign(ctxT(t), csr, id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.VerifyIssued(chain, key.Public(), id, e.ca.Roots(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if toks := e.ca.Tokens(); len(toks) != 1 || toks[0] != "Bearer "+tokenA {
		t.Errorf("CA received tokens %q, want the token over loopback", toks)
	}
}

func TestNewRefusesPlaintextTokenToRemoteAddress(t *testing.T) {
	// New does not dial, so no traffic leaves the machine.
	_, err := New(Config{Transport: controlplane.Config{
		Addr:      "istiod.istio-system.svc:15010",
		Plaintext: true,
		Token:     credfetcher.File{Path: "/nonexistent"},
	}})
	if !errors.Is(err, controlplane.ErrUnverifiedPeer) {
		t.Fatalf("New error %v, want ErrUnverifiedPeer", err)
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New without an address succeeded")
	}
}

func TestBadAnswersAreReturnedForTheCallerToJudge(t *testing.T) {
	tests := []struct {
		mode istioca.Mode
		want error
	}{
		{istioca.ModeWrongSAN, pki.ErrIdentityMismatch},
		{istioca.ModeForeignChain, pki.ErrUntrustedChain},
		{istioca.ModeExpired, pki.ErrNotValidNow},
		{istioca.ModeWrongKey, pki.ErrKeyMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			e := newEnv(t, istioca.Config{}, nil)
			e.ca.SetMode(tt.mode)
			id := e.ca.Identity(appSA)
			key, csr := newCSR(t, id)
			chain, err := e.client.Sign(ctxT(t), csr, id, time.Hour)
			if err != nil {
				t.Fatalf("Sign: %v", err)
			}
			if err := pki.VerifyIssued(chain, key.Public(), id, e.ca.Roots(), time.Now()); !errors.Is(err, tt.want) {
				t.Errorf("VerifyIssued: %v, want %v", err, tt.want)
			}
		})
	}
}

func TestGarbageAnswerIsAnErrorWithoutRetry(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	e.ca.SetMode(istioca.ModeGarbage)
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	_, err := e.client.Sign(ctxT(t), csr, id, time.Hour)
	if !errors.Is(err, ErrBadAnswer) {
		t.Fatalf("Sign error %v, want ErrBadAnswer", err)
	}
	if n := e.ca.Requests(); n != 1 {
		t.Errorf("CA received %d requests, want 1", n)
	}
	if got := requestsWith(e, resultBadAnswer); got != 1 {
		t.Errorf("requests{result=bad_answer} = %v, want 1", got)
	}
}

func TestMaxTTLCapsValidity(t *testing.T) {
	e := newEnv(t, istioca.Config{MaxTTL: time.Hour}, nil)
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	chain, err := e.client.Sign(ctxT(t), csr, id, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if got := chain[0].NotAfter.Sub(chain[0].NotBefore); got != time.Hour+time.Minute {
		t.Errorf("leaf lifetime %v, want the CA's one-hour cap", got)
	}
	if got := e.ca.LastRequest().GetValidityDuration(); got != 86400 {
		t.Errorf("validity_duration %d, want 86400", got)
	}
}

func TestCAOutageAndReturn(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); err != nil {
		t.Fatal(err)
	}
	e.ca.Stop()
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); status.Code(err) != codes.Unavailable {
		t.Fatalf("Sign with the CA down: %v, want Unavailable", err)
	}
	e.ca.Restart(t)
	// The failed attempts retired the connection, so this one dials afresh
	// instead of waiting out gRPC's reconnect backoff.
	start := time.Now()
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); err != nil {
		t.Fatalf("Sign after the CA returned: %v", err)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("first Sign after the CA returned took %v", elapsed)
	}
}

func TestConcurrentSigns(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	id := e.ca.Identity(appSA)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, err := pki.GenerateKey(pki.ECP256)
			if err != nil {
				errs <- err
				return
			}
			csr, err := pki.NewCSR(key, id)
			if err != nil {
				errs <- err
				return
			}
			chain, err := e.client.Sign(ctxT(t), csr, id, time.Hour)
			if err == nil {
				err = pki.VerifyIssued(chain, key.Public(), id, e.ca.Roots(), time.Now())
			}
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
}

func TestCloseTwiceAndSignAfterClose(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := e.client.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.client.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); !errors.Is(err, ErrClosed) {
		t.Fatalf("Sign after Close: %v, want ErrClosed", err)
	}
}

func TestMetricsRegisterTwiceInOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := Config{Transport: controlplane.Config{Addr: "127.0.0.1:1"}, Registerer: reg}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("second client in the same registry: %v", err)
	}
	if a.metrics.requests != b.metrics.requests {
		t.Error("second client did not share the registered counter")
	}
}

func TestLogsNeverCarryTheToken(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	e := newEnv(t, istioca.Config{}, func(c *Config) { c.Logger = zap.New(core) })
	e.ca.FailNext(2, codes.Unavailable)
	id := e.ca.Identity(appSA)
	_, csr := newCSR(t, id)
	for range 2 {
		if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); status.Code(err) != codes.Unavailable {
			t.Fatalf("Sign: %v, want Unavailable", err)
		}
	}
	if _, err := e.client.Sign(ctxT(t), csr, id, time.Hour); err != nil {
		t.Fatal(err)
	}
	writeToken(t, e.tokenPath, "unknown-secret-token")
	_, _ = e.client.Sign(ctxT(t), csr, id, time.Hour)
	if logs.Len() == 0 {
		t.Fatal("no logs recorded")
	}
	for _, entry := range logs.All() {
		text := entry.Message
		for k, v := range entry.ContextMap() {
			text += " " + k + "=" + toString(v)
		}
		if strings.Contains(text, tokenA) || strings.Contains(text, "unknown-secret-token") {
			t.Errorf("log entry carries a token: %s", text)
		}
	}
}

func toString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case error:
		return v.Error()
	}
	return ""
}

func TestPlaintextPort(t *testing.T) {
	for addr, want := range map[string]bool{
		"istiod.istio-system.svc:15010": true,
		"127.0.0.1:15010":               true,
		"[::1]:15010":                   true,
		"istiod.istio-system.svc:15012": false,
		"istiod:150100":                 false,
		"15010":                         false,
		"":                              false,
	} {
		if got := PlaintextPort(addr); got != want {
			t.Errorf("PlaintextPort(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestCodeLabel(t *testing.T) {
	for c, want := range map[codes.Code]string{
		codes.OK:                "ok",
		codes.Unavailable:       "unavailable",
		codes.DeadlineExceeded:  "deadline_exceeded",
		codes.ResourceExhausted: "resource_exhausted",
		codes.Unauthenticated:   "unauthenticated",
	} {
		if got := codeLabel(c); got != want {
			t.Errorf("codeLabel(%s) = %q, want %q", c, got, want)
		}
	}
}

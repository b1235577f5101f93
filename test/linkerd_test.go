package test

import (
	"context"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/caclient/linkerd"
	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/linkerdca"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// linkerdAgent is the agent (internal/app, as cmd/agent runs it) with
// CA_PROVIDER=Linkerd and nothing else of Linkerd's said: the identity, the
// rotation policy (refresh at 70 %, delay clamped to [10s, 24h]), the token
// audience and the identity service's name are the production defaults. It
// runs on a fake clock against a test identity service over TLS and serves
// SDS on a Unix socket.
type linkerdAgent struct {
	*appAgent
	ca *linkerdca.Server
	id pki.Identity
}

const linkerdToken = "projected-token-of-web"

func startLinkerdAgent(t *testing.T, lifetime time.Duration) *linkerdAgent {
	t.Helper()
	// A whole second, so x509's second-granular NotAfter gives an exact life.
	fc := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	id := linkerdca.Identity("default", "web")
	ca := linkerdca.Start(t, linkerdca.Config{
		Tokens:   map[string]string{linkerdToken: id.DNSName},
		Now:      fc.Now,
		Lifetime: lifetime,
	})
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "linkerd-token")
	rootFile := filepath.Join(dir, "trust-anchors.pem")
	for path, b := range map[string][]byte{tokFile: []byte(linkerdToken), rootFile: ca.RootPEM()} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a := startApp(t, appOpts{clock: fc, env: []string{
		"CA_PROVIDER=Linkerd", "CA_ADDR=" + ca.Addr(), "CA_ROOT_CA=" + rootFile,
		"MESHAGENT_TOKEN_PATH=" + tokFile, "POD_NAMESPACE=default", "SERVICE_ACCOUNT=web",
	}})
	return &linkerdAgent{appAgent: a, ca: ca, id: id}
}

// stream opens an Envoy-like SDS stream for the workload certificate.
func (a *linkerdAgent) stream(t *testing.T) *sdsclient.Stream {
	t.Helper()
	return a.appAgent.stream(a.dial(), secretmanager.WorkloadCertName)
}

// nextCert waits for the next response on s and checks the workload
// certificate in it: a DNS SAN equal to the identity, a key that matches,
// and a chain to the identity service's trust anchor at the fake time.
func (a *linkerdAgent) nextCert(t *testing.T, s *sdsclient.Stream) *x509.Certificate {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("waiting for an SDS response: %v", err)
	}
	chainPEM, keyPEM, ok := r.Cert(secretmanager.WorkloadCertName)
	if !ok {
		t.Fatalf("response names %v, no workload certificate", r.Names)
	}
	chain, err := pki.ParseCertificates(chainPEM)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	leaf := chain[0]
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != a.id.DNSName || len(leaf.URIs) != 0 {
		t.Fatalf("served leaf names DNS %v URI %v, want only %s", leaf.DNSNames, leaf.URIs, a.id.DNSName)
	}
	if err := pki.VerifyIssued(chain, key.Public(), a.id, a.ca.Roots(), a.clock.Now()); err != nil {
		t.Fatalf("served certificate: %v", err)
	}
	return leaf
}

// SDS serves a Linkerd-issued certificate with the DNS SAN, and replaces it
// on the same stream at 70 % of its lifetime (with the default jitter of
// SECRET_GRACE_PERIOD_RATIO_JITTER, ±1 % of the life).
func TestLinkerdCertificateServedAndRotatedAt70Percent(t *testing.T) {
	const life = 100 * time.Second
	a := startLinkerdAgent(t, life)
	start := a.clock.Now()
	s := a.stream(t)

	first := a.nextCert(t, s)
	if !first.NotAfter.Equal(start.Add(life)) {
		t.Fatalf("first NotAfter %s, want %s", first.NotAfter, start.Add(life))
	}
	renewAt := a.workloadCert().RenewAt
	if earliest, latest := start.Add(69*time.Second), start.Add(71*time.Second); renewAt.Before(earliest) || renewAt.After(latest) {
		t.Fatalf("renewal scheduled at %s, want 70 %% of %s ±1 %% (%s to %s)", renewAt, life, earliest, latest)
	}
	reqs := a.ca.Requests()
	if len(reqs) != 1 || reqs[0].Token != linkerdToken || reqs[0].Identity != a.id.DNSName {
		t.Fatalf("identity service saw %+v", reqs)
	}
	if got := a.ca.Issued(); got != 1 {
		t.Fatalf("identity service issued %d certificates, want 1", got)
	}

	// Up to just before renew_at no timer fires; at renew_at a new
	// certificate comes on the same stream.
	a.stepFiringNothing(renewAt.Sub(a.clock.Now())-time.Millisecond, "before renew_at")
	a.clock.Step(time.Millisecond)
	second := a.nextCert(t, s)
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("the same certificate was pushed again")
	}
	if want := renewAt.Add(life).Truncate(time.Second); !second.NotAfter.Equal(want) {
		t.Fatalf("second NotAfter %s, want %s", second.NotAfter, want)
	}
	if a.ca.Issued() != 2 {
		t.Fatalf("identity service issued %d certificates, want 2", a.ca.Issued())
	}
}

// A Linkerd lifetime so short that 70 % is under 10 s still waits 10 s.
func TestLinkerdRenewalDelayClampedToTenSeconds(t *testing.T) {
	a := startLinkerdAgent(t, 12*time.Second)
	start := a.clock.Now()
	s := a.stream(t)
	a.nextCert(t, s)
	if got, want := a.workloadCert().RenewAt, start.Add(10*time.Second); !got.Equal(want) {
		t.Fatalf("renewal scheduled at %s, want %s", got, want)
	}
}

// A wrong-identity answer is rejected: the previous certificate stays in
// service and nothing is pushed, until a good answer comes on retry.
func TestLinkerdWrongIdentityAnswerRejected(t *testing.T) {
	const life = 100 * time.Second
	a := startLinkerdAgent(t, life)
	s := a.stream(t)
	first := a.nextCert(t, s)
	held := a.workloadCert()

	a.ca.SetMode(linkerdca.ModeWrongIdentity)
	a.step(held.RenewAt.Sub(a.clock.Now()))
	// The identity service answers the renewal with a certificate for another
	// identity; the manager rejects it, keeps the one it holds and schedules a
	// retry.
	waitFor(t, "the rejected renewal", func() bool {
		reqs := a.ca.Requests()
		return len(reqs) == 2 && reqs[1].Code == codes.OK && a.logs.FilterMessage("CA answer rejected").Len() == 1
	})
	if got := a.workloadCert().Serial; got != held.Serial {
		t.Fatalf("held certificate changed to %s after a wrong-identity answer", got)
	}

	// The service mends; the retry (backoff at most 500 ms) brings a good
	// one. It is the next response on s: nextCert would fail on a pushed
	// wrong-identity certificate.
	a.ca.SetMode(linkerdca.ModeOK)
	a.step(time.Second)
	second := a.nextCert(t, s)
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("the old certificate was pushed again")
	}
}

// The token stays home when the identity service presents another name: no
// request reaches it, and the agent holds no certificate.
func TestLinkerdTokenNotSentToUnexpectedName(t *testing.T) {
	id := linkerdca.Identity("default", "web")
	ca := linkerdca.Start(t, linkerdca.Config{
		Tokens:      map[string]string{linkerdToken: id.DNSName},
		ServerNames: []string{"linkerd-identity.elsewhere.serviceaccount.identity.elsewhere.cluster.local"},
	})
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(linkerdToken), 0o600); err != nil {
		t.Fatal(err)
	}
	client, err := linkerd.New(linkerd.Config{
		Transport: controlplane.Config{Addr: ca.Addr(), Roots: controlplane.StaticRoots{Pool: ca.Roots()}},
		Token:     credfetcher.File{Path: tokFile},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Sign(context.Background(), csr, id, 0)
	if err == nil {
		t.Fatal("Sign succeeded against an identity service with another name")
	}
	if errors.Is(err, credfetcher.ErrNoToken) {
		t.Fatalf("failed for the wrong reason: %v", err)
	}
	if n := len(ca.Requests()); n != 0 {
		t.Fatalf("identity service saw %d requests, tokens %q", n, ca.Tokens())
	}
}

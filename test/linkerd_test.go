package test

import (
	"context"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/caclient/linkerd"
	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/sds"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/linkerdca"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// linkerdAgent is the CA path of the agent wired for CA_PROVIDER=Linkerd: the
// Linkerd identity client, the secret manager with Linkerd's rotation policy
// (refresh at 70 %, delay clamped to [10s, 24h]) on a fake clock, and the SDS
// server on a Unix socket, against a test identity service over TLS.
type linkerdAgent struct {
	ca      *linkerdca.Server
	clock   *clocktesting.FakeClock
	manager *secretmanager.Manager
	socket  string
	id      pki.Identity
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
	if err := os.WriteFile(tokFile, []byte(linkerdToken), 0o600); err != nil {
		t.Fatal(err)
	}
	roots, err := secretmanager.NewRoots(ca.RootPEM(), "test")
	if err != nil {
		t.Fatal(err)
	}
	client, err := linkerd.New(linkerd.Config{
		Transport: caclient.TransportConfig{Addr: ca.Addr(), Roots: roots},
		Token:     credfetcher.File{Path: tokFile},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	m, err := secretmanager.New(secretmanager.Config{
		Identity:      id,
		CA:            client,
		Roots:         roots,
		GraceRatio:    0.3,
		GraceJitter:   -1, // none: Linkerd's proxy refreshes at exactly 70 %
		MinRenewDelay: 10 * time.Second,
		MaxRenewDelay: 24 * time.Hour,
		Clock:         fc,
		SignTimeout:   10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "sds", "socket")
	srv, err := sds.New(sds.Config{Secrets: m})
	if err != nil {
		t.Fatal(err)
	}
	uds, err := udsserver.New(udsserver.Config{SocketPath: socket, Services: []func(*grpc.Server){srv.Register}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{m.Run, uds.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				t.Errorf("component stopped: %v", err)
			}
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return &linkerdAgent{ca: ca, clock: fc, manager: m, socket: socket, id: id}
}

// stream opens an Envoy-like SDS stream for the workload certificate.
func (a *linkerdAgent) stream(t *testing.T) *sdsclient.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, a.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, err := c.Stream(context.Background(), sdsclient.StreamConfig{Names: []string{secretmanager.WorkloadCertName}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
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

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// held is the workload certificate the manager holds now.
func (a *linkerdAgent) held(t *testing.T) *secretmanager.Secret {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sec, err := a.manager.Secret(ctx, secretmanager.WorkloadCertName)
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

// SDS serves a Linkerd-issued certificate with the DNS SAN, and replaces it
// on the same stream at 70 % of its lifetime.
func TestLinkerdCertificateServedAndRotatedAt70Percent(t *testing.T) {
	const life = 100 * time.Second
	a := startLinkerdAgent(t, life)
	start := a.clock.Now()
	s := a.stream(t)

	first := a.nextCert(t, s)
	if !first.NotAfter.Equal(start.Add(life)) {
		t.Fatalf("first NotAfter %s, want %s", first.NotAfter, start.Add(life))
	}
	if got, want := a.held(t).RenewAt, start.Add(70*time.Second); !got.Equal(want) {
		t.Fatalf("renewal scheduled at %s, want %s (70 %% of %s)", got, want, life)
	}
	reqs := a.ca.Requests()
	if len(reqs) != 1 || reqs[0].Token != linkerdToken || reqs[0].Identity != a.id.DNSName {
		t.Fatalf("identity service saw %+v", reqs)
	}

	// One second before 70 %: the timer is still pending and nothing is asked.
	waitFor(t, "the renewal timer", a.clock.HasWaiters)
	a.clock.Step(69 * time.Second)
	if !a.clock.HasWaiters() || a.ca.Issued() != 1 {
		t.Fatalf("renewed before 70 %% (timer pending %v, issued %d)", a.clock.HasWaiters(), a.ca.Issued())
	}

	// At 70 %: a new certificate on the same stream.
	a.clock.Step(time.Second)
	second := a.nextCert(t, s)
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("the same certificate was pushed again")
	}
	if want := start.Add(70*time.Second + life); !second.NotAfter.Equal(want) {
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
	if got, want := a.held(t).RenewAt, start.Add(10*time.Second); !got.Equal(want) {
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
	held := a.held(t).Leaf.SerialNumber

	a.ca.SetMode(linkerdca.ModeWrongIdentity)
	waitFor(t, "the renewal timer", a.clock.HasWaiters)
	a.clock.Step(70 * time.Second)
	// The identity service answers the renewal with a certificate for another
	// identity; the manager rejects it and schedules a retry.
	waitFor(t, "the rejected renewal", func() bool {
		reqs := a.ca.Requests()
		return len(reqs) == 2 && reqs[1].Code == codes.OK && a.clock.HasWaiters()
	})
	if got := a.held(t).Leaf.SerialNumber; got.Cmp(held) != 0 {
		t.Fatalf("held certificate changed to %s after a wrong-identity answer", got)
	}
	select {
	case r := <-s.Responses():
		t.Fatalf("a response was pushed after a rejected answer: %v", r.Names)
	case <-time.After(100 * time.Millisecond):
	}

	// The service mends; the retry (backoff at most 500 ms) brings a good one.
	a.ca.SetMode(linkerdca.ModeOK)
	a.clock.Step(time.Second)
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
		Transport: caclient.TransportConfig{Addr: ca.Addr(), Roots: caclient.StaticRoots{Pool: ca.Roots()}},
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

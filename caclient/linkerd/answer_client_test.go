package linkerd_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/caclient/linkerd"
	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/linkerdca"
)

// Sign returns what the service answered; pki.VerifyIssued is what rejects a
// bad answer, each for its own reason.
func TestBadAnswersAreReturnedAndRejectedByVerifyIssued(t *testing.T) {
	tests := []struct {
		mode linkerdca.Mode
		want error
	}{
		{linkerdca.ModeWrongIdentity, pki.ErrIdentityMismatch},
		{linkerdca.ModeExpired, pki.ErrNotValidNow},
		{linkerdca.ModeWrongKey, pki.ErrKeyMismatch},
		{linkerdca.ModeForeignChain, pki.ErrUntrustedChain},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			e := setup(t, linkerdca.Config{}, nil)
			e.s.SetMode(tt.mode)
			chain, err := e.sign(t)
			if err != nil {
				t.Fatalf("Sign: %v", err)
			}
			err = pki.VerifyIssued(chain, e.key.Public(), webID, e.s.Roots(), time.Now())
			if !errors.Is(err, tt.want) {
				t.Fatalf("VerifyIssued: %v, want %v", err, tt.want)
			}
		})
	}
}

func TestMalformedAnswers(t *testing.T) {
	for _, mode := range []linkerdca.Mode{linkerdca.ModeGarbage, linkerdca.ModePEM} {
		t.Run(mode.String(), func(t *testing.T) {
			e := setup(t, linkerdca.Config{}, nil)
			e.s.SetMode(mode)
			chain, err := e.sign(t)
			if !errors.Is(err, linkerd.ErrMalformedAnswer) {
				t.Fatalf("Sign: %d certificates, error %v; want ErrMalformedAnswer", len(chain), err)
			}
			if got := e.outcomes("malformed_answer"); got != 1 {
				t.Errorf("requests_total{outcome=malformed_answer} = %v, want 1", got)
			}
		})
	}
}

// A valid_until that is missing or disagrees with the leaf is logged and
// counted; the leaf's own NotAfter is what the caller sees.
func TestValidUntilDisagreement(t *testing.T) {
	tests := []struct {
		mode   linkerdca.Mode
		reason string
	}{
		{linkerdca.ModeOK, ""},
		{linkerdca.ModeNoValidUntil, "valid_until_missing"},
		{linkerdca.ModeValidUntilMismatch, "valid_until_mismatch"},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			e := setup(t, linkerdca.Config{}, nil)
			e.s.SetMode(tt.mode)
			chain, err := e.sign(t)
			if err != nil {
				t.Fatal(err)
			}
			if err := pki.VerifyIssued(chain, e.key.Public(), webID, e.s.Roots(), time.Now()); err != nil {
				t.Fatal(err)
			}
			for _, reason := range []string{"valid_until_missing", "valid_until_mismatch"} {
				want := 0.0
				if reason == tt.reason {
					want = 1
				}
				if got := metricValue(e.reg, "meshagent_linkerd_identity_answer_warnings_total", "reason", reason); got != want {
					t.Errorf("answer_warnings_total{reason=%s} = %v, want %v", reason, got, want)
				}
			}
		})
	}
}

// After the service goes away and comes back on the same port, the next Sign
// works at once: the failed connection was dropped, so no reconnect backoff
// is left over.
func TestRecoversAfterRestart(t *testing.T) {
	e := setup(t, linkerdca.Config{}, nil)
	if _, err := e.sign(t); err != nil {
		t.Fatal(err)
	}
	e.s.Stop()
	_, err := e.sign(t)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Sign with the service down: %v, want Unavailable", err)
	}
	e.s.Restart(t)
	start := time.Now()
	if _, err := e.sign(t); err != nil {
		t.Fatalf("Sign after restart: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Sign after restart took %s", d)
	}
}

func TestSlowServiceTimesOut(t *testing.T) {
	e := setup(t, linkerdca.Config{}, func(c *linkerd.Config) { c.Timeout = 200 * time.Millisecond })
	e.s.SetDelay(time.Hour)
	start := time.Now()
	_, err := e.sign(t)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Sign: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Sign took %s with a 200ms timeout", d)
	}
}

func TestCallerCancels(t *testing.T) {
	e := setup(t, linkerdca.Config{}, nil)
	e.s.SetDelay(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := e.c.Sign(ctx, e.csr, webID, 0)
		errc <- err
	}()
	// Cancelled once the service holds the request, so the cancellation
	// ends a call in flight.
	testwait.For(t, "the request at the identity service", func() bool { return len(e.s.Requests()) > 0 })
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Fatalf("Sign: %v, want Canceled", err)
	}
}

func TestTokenUnavailable(t *testing.T) {
	e := setup(t, linkerdca.Config{}, func(c *linkerd.Config) {
		c.Token = credfetcher.File{Path: t.TempDir() + "/missing"}
	})
	_, err := e.sign(t)
	if !errors.Is(err, credfetcher.ErrNoToken) {
		t.Fatalf("Sign: %v, want ErrNoToken", err)
	}
	if n := len(e.s.Requests()); n != 0 {
		t.Fatalf("server saw %d requests without a token", n)
	}
	if got := e.outcomes("token_error"); got != 1 {
		t.Errorf("requests_total{outcome=token_error} = %v, want 1", got)
	}
}

// The token is read afresh for every call, and travels in the body only.
func TestTokenReadEveryCallAndOnlyInBody(t *testing.T) {
	e := setup(t, linkerdca.Config{}, func(c *linkerd.Config) {
		// Given as a transport token, it must still not become metadata.
		c.Transport.Token, c.Token = c.Token, nil
	})
	if _, err := e.sign(t); err != nil {
		t.Fatal(err)
	}
	e.s.AddToken("rotated-token", webID.DNSName)
	e.writeToken(t, "rotated-token")
	if _, err := e.sign(t); err != nil {
		t.Fatal(err)
	}
	reqs := e.s.Requests()
	if len(reqs) != 2 || reqs[0].Token != token || reqs[1].Token != "rotated-token" {
		t.Fatalf("server saw tokens %q", e.s.Tokens())
	}
	for i, r := range reqs {
		if r.Authorization != "" {
			t.Errorf("request %d carried authorization metadata %q", i, r.Authorization)
		}
	}
}

func TestRejectsNonDNSIdentity(t *testing.T) {
	e := setup(t, linkerdca.Config{}, nil)
	for _, id := range []pki.Identity{
		pki.SPIFFEIdentity("cluster.local", "default", "web"),
		{},
		{DNSName: "bad name"},
	} {
		if _, err := e.c.Sign(context.Background(), e.csr, id, 0); err == nil {
			t.Errorf("Sign(%+v) succeeded", id)
		}
	}
	if n := len(e.s.Requests()); n != 0 {
		t.Fatalf("server saw %d requests", n)
	}
	if _, err := e.c.Sign(context.Background(), e.csr, pki.SPIFFEIdentity("cluster.local", "default", "web"), 0); !errors.Is(err, linkerd.ErrNotDNSIdentity) {
		t.Errorf("SPIFFE identity: %v, want ErrNotDNSIdentity", err)
	}
}

func TestCloseTwiceThenSign(t *testing.T) {
	e := setup(t, linkerdca.Config{}, nil)
	if _, err := e.sign(t); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := e.sign(t); !errors.Is(err, linkerd.ErrClosed) {
		t.Fatalf("Sign after Close: %v, want ErrClosed", err)
	}
}

func TestConcurrentSign(t *testing.T) {
	e := setup(t, linkerdca.Config{}, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			chain, err := e.c.Sign(context.Background(), e.csr, webID, 0)
			if err == nil {
				err = pki.VerifyIssued(chain, e.key.Public(), webID, e.s.Roots(), time.Now())
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
	if got := e.outcomes("OK"); got != 8 {
		t.Errorf("requests_total{outcome=OK} = %v, want 8", got)
	}
}

func TestNewChecksConfig(t *testing.T) {
	tok := credfetcher.File{Path: "/nonexistent"}
	tests := []struct {
		name string
		cfg  linkerd.Config
	}{
		{"no address", linkerd.Config{Token: tok}},
		{"no token", linkerd.Config{Transport: controlplane.Config{Addr: "127.0.0.1:8080"}}},
		{"plaintext off loopback", linkerd.Config{Token: tok, Transport: controlplane.Config{Addr: "identity.example:8080", Plaintext: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c, err := linkerd.New(tt.cfg); err == nil {
				_ = c.Close()
				t.Fatal("New accepted the config")
			}
		})
	}
}

func TestNewDefaultsServerName(t *testing.T) {
	tok := credfetcher.File{Path: "/nonexistent"}
	l5d, err := pki.LinkerdScheme("example.org", "l5d")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		cfg  linkerd.Config
		want string
	}{
		{linkerd.Config{}, "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"},
		{linkerd.Config{Scheme: l5d}, "linkerd-identity.l5d.serviceaccount.identity.l5d.example.org"},
		{linkerd.Config{Transport: controlplane.Config{ServerName: "identity.example"}}, "identity.example"},
	}
	for _, tt := range tests {
		tt.cfg.Token = tok
		tt.cfg.Transport.Addr = "127.0.0.1:8080"
		c, err := linkerd.New(tt.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ServerName(); got != tt.want {
			t.Errorf("ServerName = %q, want %q", got, tt.want)
		}
		_ = c.Close()
	}
	istio, err := pki.IstioScheme("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	_, err = linkerd.New(linkerd.Config{Scheme: istio, Token: tok, Transport: controlplane.Config{Addr: "127.0.0.1:8080"}})
	if err == nil || !strings.Contains(err.Error(), "is not Linkerd's") {
		t.Errorf("New with Istio's scheme: %v, want a refusal", err)
	}
}

// A client rebuilt against the same registry (a restart of the CA client)
// is accepted and shares the metrics: both clients' requests land in one
// counter.
func TestNewTwiceSameRegistry(t *testing.T) {
	var cfg linkerd.Config
	e := setup(t, linkerdca.Config{}, func(c *linkerd.Config) { cfg = *c })
	second, err := linkerd.New(cfg)
	if err != nil {
		t.Fatalf("a second client on the same registry: %v", err)
	}
	defer second.Close()
	if _, err := e.sign(t); err != nil {
		t.Fatal(err)
	}
	if _, err := second.Sign(context.Background(), e.csr, webID, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := e.outcomes("OK"); got != 2 {
		t.Errorf("requests_total{outcome=OK} = %v after one request by each client, want 2", got)
	}
}

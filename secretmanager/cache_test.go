package secretmanager

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/caclient/istio"
	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/istioca"
)

// call is one Sign of fakeSigner, waiting on its own release channel.
type call struct {
	id      pki.Identity
	release chan error // nil: issue the certificate; an error: fail with it
}

// signMode says how fakeSigner answers an identity.
type signMode int

const (
	signHold signMode = iota // the call waits for its release
	signOK                   // issue at once
	signFail                 // fail at once
)

// fakeSigner is a CA whose calls each wait on their own release channel (or
// answer at once, per identity), and which records how many run at once.
type fakeSigner struct {
	ca    *localca.CA
	calls chan *call

	mu          sync.Mutex
	modes       map[pki.Identity]signMode
	count       map[pki.Identity]int
	inFlight    int
	maxInFlight int
}

func newFakeSigner(t testing.TB, now func() time.Time) *fakeSigner {
	return &fakeSigner{
		ca:    newCA(t, localca.Config{Intermediate: true, Now: now}),
		calls: make(chan *call, 100_000),
		modes: map[pki.Identity]signMode{},
		count: map[pki.Identity]int{},
	}
}

func (f *fakeSigner) setMode(id pki.Identity, m signMode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.modes[id] = m
}

func (f *fakeSigner) requests(id pki.Identity) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count[id]
}

func (f *fakeSigner) peak() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxInFlight
}

func (f *fakeSigner) Sign(ctx context.Context, csrDER []byte, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	f.mu.Lock()
	f.count[id]++
	f.inFlight++
	f.maxInFlight = max(f.maxInFlight, f.inFlight)
	mode := f.modes[id]
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.mu.Unlock()
	}()
	var err error
	switch mode {
	case signFail:
		err = errors.New("CA unavailable")
	case signHold:
		c := &call{id: id, release: make(chan error, 1)}
		f.calls <- c
		select {
		case err = <-c.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	csr, err := pki.ParseCSR(csrDER)
	if err != nil {
		return nil, err
	}
	return f.ca.Issue(localca.Leaf{PublicKey: csr.PublicKey, Identity: id, TTL: ttl})
}

func (f *fakeSigner) Close() error { return nil }

// nextCall returns the next Sign waiting for release, once everything in
// the test's bubble waits (synctest.Wait): a request that is not there then
// is not coming before time moves.
func (f *fakeSigner) nextCall(t *testing.T) *call {
	t.Helper()
	synctest.Wait()
	select {
	case c := <-f.calls:
		return c
	default:
		t.Fatal("no CA request")
		return nil
	}
}

// noCall checks that no Sign is waiting for release once everything in the
// test's bubble waits.
func (f *fakeSigner) noCall(t *testing.T, what string) {
	t.Helper()
	synctest.Wait()
	select {
	case c := <-f.calls:
		t.Fatalf("unexpected CA request for %s: %s", c.id, what)
	default:
	}
}

// cache is a manager with no own identity (as in node mode) over a
// fakeSigner, in the calling test's synctest bubble: the manager's clock is
// the bubble's.
type cache struct {
	t      *testing.T
	signer *fakeSigner
	m      *Manager
	logs   *observer.ObservedLogs
}

func newCache(t *testing.T, mutate func(*Config)) *cache {
	t.Helper()
	signer := newFakeSigner(t, time.Now)
	roots, err := secret.NewRoots(signer.ca.RootPEM(), "test")
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	cfg := Config{CA: signer, CSRSigner: signer, Roots: roots, TTL: time.Hour, Rand: func() float64 { return 0.5 }, Logger: zap.New(core), GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &cache{t: t, signer: signer, m: m, logs: logs}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v", err)
		}
	})
	return c
}

func ident(n int) pki.Identity {
	return pki.SPIFFEIdentity("cluster.local", "ns", fmt.Sprintf("sa%d", n))
}

// own asks the manager for its own identity.
var own pki.Identity

// wait blocks in Secret("default") for id in a goroutine; the result arrives
// on the returned channel.
func (c *cache) wait(id pki.Identity) <-chan *Secret {
	out := make(chan *Secret, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := c.m.Secret(ctx, id, WorkloadCertName)
		if err != nil {
			c.t.Errorf("Secret for %s: %v", id, err)
		}
		out <- s
	}()
	return out
}

// waitFor checks cond once everything in the bubble waits: what does not
// hold then does not before time moves.
func (c *cache) waitFor(what string, cond func() bool) {
	c.t.Helper()
	settled(c.t, what, cond)
}

// step moves the bubble's clock on by d once everything waits, and lets
// what fell due run.
func (c *cache) step(d time.Duration) {
	c.t.Helper()
	bubbleStep(d)
}

func (c *cache) held(id pki.Identity) bool {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	_, ok := c.m.entries[id]
	return ok
}

func (c *cache) cert(id pki.Identity) *Secret {
	c.t.Helper()
	s, err := c.m.Secret(context.Background(), id, WorkloadCertName)
	if err != nil {
		c.t.Fatalf("Secret for %s: %v", id, err)
	}
	return s
}

// recv is the answer a caller got once everything in the bubble waits.
func recv(t *testing.T, ch <-chan *Secret) *Secret {
	t.Helper()
	synctest.Wait()
	select {
	case s := <-ch:
		return s
	default:
		t.Fatal("caller still waiting")
		return nil
	}
}

// However many callers wait, each identity costs one CSR, and each caller
// gets its own identity's certificate.
func TestCacheOneCSRPerIdentity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, nil)
		const identities, callers = 5, 20
		results := make([][]<-chan *Secret, identities)
		for i := range identities {
			for range callers {
				results[i] = append(results[i], c.wait(ident(i)))
			}
		}
		c.waitFor("every caller waiting", func() bool {
			for i := range identities {
				if c.m.waiting(ident(i)) < callers {
					return false
				}
			}
			return true
		})
		calls := map[pki.Identity]*call{}
		for range identities {
			k := c.signer.nextCall(t)
			if calls[k.id] != nil {
				t.Fatalf("second CSR for %s while one is out", k.id)
			}
			calls[k.id] = k
		}
		c.signer.noCall(t, "every identity already has its CSR out")
		for _, k := range calls {
			k.release <- nil
		}
		for i := range identities {
			first := recv(t, results[i][0])
			for _, ch := range results[i][1:] {
				if s := recv(t, ch); s != first {
					t.Fatalf("callers of %s got different certificates", ident(i))
				}
			}
			if first.Identity != ident(i) || first.Leaf.URIs[0].String() != ident(i).SPIFFEID {
				t.Fatalf("caller of %s got a certificate for %s", ident(i), first.Identity)
			}
			if n := c.signer.requests(ident(i)); n != 1 {
				t.Fatalf("%d CSRs for %s, want 1", n, ident(i))
			}
		}
		// /debug/certs lists one certificate per identity, then the root.
		certs := c.m.Certs()
		if len(certs) != identities+1 || certs[identities].ResourceName != RootCertName {
			t.Fatalf("Certs() = %+v", certs)
		}
		for i := range identities {
			if certs[i].Identity != ident(i).String() || certs[i].ResourceName != WorkloadCertName {
				t.Fatalf("Certs()[%d] = %+v, want %s", i, certs[i], ident(i))
			}
		}
	})
}

// With every slot taken, the next free slot goes to a waiting caller, then
// to a first certificate (Prefetch), then to a renewal; never more than the
// limit run at once.
func TestCacheLimitAndPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, func(cfg *Config) { cfg.MaxConcurrentCSRs = 2 })
		renewal, a, b, warm, waiting := ident(0), ident(1), ident(2), ident(3), ident(4)

		// renewal holds a certificate that will be due.
		if err := c.m.Prefetch(renewal); err != nil {
			t.Fatal(err)
		}
		c.signer.nextCall(t).release <- nil
		c.waitFor("the first certificate", func() bool { return c.m.Certs()[0].Identity == renewal.String() })

		// a and b take both slots a second before renewal falls due (half of
		// the 1h life; the bubble's clock also runs the CSRs' SignTimeout).
		c.step(30*time.Minute - time.Second)
		for _, id := range []pki.Identity{a, b} {
			if err := c.m.Prefetch(id); err != nil {
				t.Fatal(err)
			}
		}
		callA, callB := c.signer.nextCall(t), c.signer.nextCall(t)
		if callA.id == b {
			callA, callB = callB, callA
		}
		// renewal falls due, warm is prefetched and a caller starts waiting
		// for its own identity: all three wait for a slot.
		c.step(time.Second)
		if err := c.m.Prefetch(warm); err != nil {
			t.Fatal(err)
		}
		got := c.wait(waiting)
		c.waitFor("the caller waiting", func() bool { return c.m.waiting(waiting) == 1 })
		c.signer.noCall(t, "both slots are taken")

		callA.release <- nil
		if k := c.signer.nextCall(t); k.id != waiting {
			t.Fatalf("first free slot went to %s, want the waiting caller's %s", k.id, waiting)
		} else {
			callB.release <- nil
			if k2 := c.signer.nextCall(t); k2.id != warm {
				t.Fatalf("second free slot went to %s, want the prefetched %s", k2.id, warm)
			} else {
				k.release <- nil
				recv(t, got)
				if k3 := c.signer.nextCall(t); k3.id != renewal {
					t.Fatalf("third free slot went to %s, want the renewal of %s", k3.id, renewal)
				} else {
					k2.release <- nil
					k3.release <- nil
				}
			}
		}
		if p := c.signer.peak(); p > 2 {
			t.Fatalf("%d CSRs in flight at once, limit 2", p)
		}
	})
}

// An identity whose requests fail backs off on its own: another identity is
// served at once, and the failing one makes exactly one CSR per scheduled
// attempt, with growing waits.
func TestCacheFailingIdentityDoesNotDelayOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, func(cfg *Config) { cfg.MaxConcurrentCSRs = 1 })
		bad, good := ident(0), ident(1)
		c.signer.setMode(bad, signFail)
		c.signer.setMode(good, signOK)
		if err := c.m.Prefetch(bad); err != nil {
			t.Fatal(err)
		}
		c.waitFor("the first failure", func() bool { return c.logs.FilterMessage("certificate request failed").Len() == 1 })

		// good gets its certificate while bad is in backoff, without the clock moving.
		if s := recv(t, c.wait(good)); s.Identity != good {
			t.Fatalf("got a certificate for %s", s.Identity)
		}

		var delays []time.Duration
		for attempt := 1; attempt <= 6; attempt++ {
			logs := c.logs.FilterMessage("certificate request failed").All()
			c.waitFor("the failure log", func() bool {
				logs = c.logs.FilterMessage("certificate request failed").All()
				return len(logs) == attempt
			})
			entry := logs[attempt-1].ContextMap()
			if entry[logkeys.Identity] != bad.String() {
				t.Fatalf("failure logged for %v", entry[logkeys.Identity])
			}
			if n := c.signer.requests(bad); n != attempt {
				t.Fatalf("%d CSRs after %d scheduled attempts", n, attempt)
			}
			d := entry[logkeys.RetryIn].(time.Duration)
			delays = append(delays, d)
			c.step(d - time.Millisecond)
			if n := c.signer.requests(bad); n != attempt {
				t.Fatalf("retry before its backoff of %s ended", d)
			}
			c.step(time.Millisecond)
		}
		for i := 1; i < len(delays); i++ {
			if delays[i] <= delays[i-1] {
				t.Fatalf("backoff does not grow: %v", delays)
			}
		}
		if n := c.signer.requests(good); n != 1 {
			t.Fatalf("%d CSRs for the healthy identity, want 1", n)
		}
	})
}

// An identity nobody holds is dropped after the idle grace period, and a
// certificate that arrives for it afterwards is discarded; asking again
// starts afresh.
func TestCacheEvictionDiscardsLateResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The request outlasts the idle grace period; its own bound (one
		// minute by default, the same instant) must not end it first.
		c := newCache(t, func(cfg *Config) { cfg.IdleGrace, cfg.SignTimeout = time.Minute, time.Hour })
		id := ident(0)
		if err := c.m.Prefetch(id); err != nil {
			t.Fatal(err)
		}
		late := c.signer.nextCall(t)
		c.m.Release(id)
		c.step(time.Minute)
		c.waitFor("the identity dropped", func() bool { return !c.held(id) })

		late.release <- nil
		c.waitFor("the late answer discarded", func() bool {
			return c.logs.FilterMessage("CA answer discarded: identity dropped meanwhile").Len() == 1
		})
		if c.held(id) || len(c.m.Certs()) != 1 { // the root only
			t.Fatalf("the late certificate was kept: %+v", c.m.Certs())
		}
		c.signer.setMode(id, signOK)
		if s := c.cert(id); s.Identity != id || c.signer.requests(id) != 2 {
			t.Fatalf("asking again made %d CSRs", c.signer.requests(id))
		}
	})
}

// A subscriber keeps an identity: it is renewed, never dropped, and its
// certificate stays in service when a renewal fails.
func TestCacheSubscriberKeepsIdentity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache(t, func(cfg *Config) { cfg.IdleGrace = time.Minute })
		id := ident(0)
		c.signer.setMode(id, signOK)
		ch, cancel := c.m.Watch(id, WorkloadCertName)
		defer cancel()
		waitSignal(t, ch, "first certificate")
		first := c.cert(id)
		c.signer.setMode(id, signFail)
		c.step(30 * time.Minute) // renewal due: fails
		c.waitFor("the failed renewal", func() bool { return c.logs.FilterMessage("certificate request failed").Len() == 1 })
		c.step(2 * time.Minute)
		if !c.held(id) || c.cert(id) != first {
			t.Fatal("the certificate in service was lost while subscribed")
		}
		c.signer.setMode(id, signOK)
		c.step(time.Minute)
		waitSignal(t, ch, "renewal")
		if c.cert(id) == first {
			t.Fatal("not renewed")
		}
		cancel()
		c.step(time.Minute)
		c.waitFor("the identity dropped once unsubscribed", func() bool { return !c.held(id) })
	})
}

// A root change is pushed to ROOTCA subscribers at once, even while every
// CSR slot is taken and no workload certificate exists.
func TestCacheRootChangeDoesNotWaitForLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		signer := newFakeSigner(t, time.Now)
		roots, err := secret.NewRoots(signer.ca.RootPEM(), "test")
		if err != nil {
			t.Fatal(err)
		}
		m, err := New(Config{Identity: testID, CA: signer, Roots: roots, MaxConcurrentCSRs: 1, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, IdleGrace: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		rootCh, cancel := m.Watch(own, RootCertName)
		defer cancel()
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		defer func() { stop(); <-done }()

		held := signer.nextCall(t) // the own identity's first CSR, never answered
		next := newCA(t, localca.Config{Name: "next"})
		both := append(append([]byte{}, signer.ca.RootPEM()...), next.RootPEM()...)
		if err := roots.Set(both, "test"); err != nil {
			t.Fatal(err)
		}
		waitSignal(t, rootCh, "ROOTCA after a root change")
		r, err := m.Secret(context.Background(), own, RootCertName)
		if err != nil || string(r.Roots) != string(both) {
			t.Fatalf("ROOTCA %v", err)
		}
		if m.Ready() == nil {
			t.Fatal("ready without a certificate")
		}
		held.release <- errors.New("gave up")
	})
}

// Against a real Istio CA that answers Unavailable: one CSR per scheduled
// attempt (the client does not retry inside a request), and the identity's
// backoff grows between attempts. On a fake clock, not in a bubble: the CA
// is a real gRPC server on loopback, outside any bubble.
func TestCAUnavailableOneCSRPerAttempt(t *testing.T) {
	fc := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	const token = "token-ns1-sa1"
	ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{token: {Namespace: "ns1", Name: "sa1"}}})
	ca.SetMode(istioca.ModeError)
	ca.SetError(codes.Unavailable)
	tokenPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenPath, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	roots, err := secret.NewRoots(ca.RootPEM(), "test")
	if err != nil {
		t.Fatal(err)
	}
	client, err := istio.New(istio.Config{Transport: controlplane.Config{
		Addr: ca.Addr(), ServerName: ca.ServerName(), Roots: roots, Token: credfetcher.File{Path: tokenPath},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	core, logs := observer.New(zapcore.InfoLevel)
	m, err := New(Config{Identity: testID, CA: client, Roots: roots, Clock: fc, Rand: func() float64 { return 0.5 }, Logger: zap.New(core), TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { stop(); <-done }()

	var last time.Duration
	for attempt := 1; attempt <= 5; attempt++ {
		var entries []observer.LoggedEntry
		testwait.For(t, "a failed attempt", func() bool {
			entries = logs.FilterMessage("certificate request failed").All()
			return len(entries) == attempt
		})
		if n := ca.Requests(); n != attempt {
			t.Fatalf("the CA received %d CSRs after %d attempts, want one per attempt", n, attempt)
		}
		d := entries[attempt-1].ContextMap()[logkeys.RetryIn].(time.Duration)
		if d <= last {
			t.Fatalf("attempt %d waits %s after %s: the backoff does not grow", attempt, d, last)
		}
		last = d
		testwait.Step(t, fc, d)
	}
}

// The cache with 10,000 identities: every one asked for by a caller at once,
// signed by an in-memory CA, at most the default number in flight.
func BenchmarkCache10000Identities(b *testing.B) {
	const n = 10_000
	for range b.N {
		b.StopTimer()
		signer := newFakeSigner(b, time.Now)
		for i := range n {
			signer.modes[ident(i)] = signOK
		}
		roots, err := secret.NewRoots(signer.ca.RootPEM(), "bench")
		if err != nil {
			b.Fatal(err)
		}
		m, err := New(Config{CA: signer, Roots: roots, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				if _, err := m.Secret(ctx, ident(i), WorkloadCertName); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		b.ReportMetric(float64(time.Since(start).Microseconds())/n, "us/identity")
		b.StopTimer()
		if p := signer.peak(); p > 8 {
			b.Fatalf("%d CSRs in flight, limit %d", p, 8)
		}
		stop()
		<-done
		b.StartTimer()
	}
}

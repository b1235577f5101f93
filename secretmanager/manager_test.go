package secretmanager

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/internal/backoff"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/notify"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testID = pki.SPIFFEIdentity("cluster.local", "ns1", "sa1")

func x509VerifyOptions(pool *x509.CertPool) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
}

// Answer modes of testCA: what a broken or hostile CA might return.
const (
	modeOK           = "ok"
	modeError        = "error"
	modeWrongSAN     = "wrong-san"
	modeForeignChain = "foreign-chain"
	modeExpired      = "expired"
	modeWrongKey     = "wrong-key"
	modeEmpty        = "empty"
)

// testCA wraps the dev CA so that it can be told to fail, to answer badly,
// or to hold requests until released.
type testCA struct {
	dev     *devca.Client
	ca      *localca.CA
	foreign *localca.CA
	now     func() time.Time

	mu       sync.Mutex
	mode     string
	requests int
	hold     chan struct{} // when set, Sign waits until it is closed
	entered  chan struct{} // receives a value when a held Sign starts waiting
}

func newTestCA(t testing.TB, now func() time.Time) *testCA {
	t.Helper()
	ca := newCA(t, localca.Config{Intermediate: true, Now: now})
	dev, err := devca.New(devca.Config{CA: ca})
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{dev: dev, ca: ca, foreign: newCA(t, localca.Config{Name: "foreign", Now: now}), now: now, mode: modeOK}
}

func (c *testCA) setMode(m string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mode = m
}

func (c *testCA) setCA(ca *localca.CA) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ca = ca
	c.dev, _ = devca.New(devca.Config{CA: ca})
}

func (c *testCA) holdRequests() (release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hold = make(chan struct{})
	c.entered = make(chan struct{}, 100)
	h := c.hold
	return func() { close(h) }
}

func (c *testCA) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests
}

func (c *testCA) Sign(ctx context.Context, csr []byte, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	c.mu.Lock()
	c.requests++
	mode, hold, entered, dev, ca := c.mode, c.hold, c.entered, c.dev, c.ca
	c.mu.Unlock()
	if hold != nil {
		entered <- struct{}{}
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	req, err := pki.ParseCSR(csr)
	if err != nil {
		return nil, err
	}
	now := c.now()
	switch mode {
	case modeError:
		return nil, errors.New("CA unavailable")
	case modeWrongSAN:
		return ca.Issue(localca.Leaf{PublicKey: req.PublicKey, Identity: pki.SPIFFEIdentity("cluster.local", "ns1", "intruder"), TTL: ttl})
	case modeForeignChain:
		return c.foreign.Issue(localca.Leaf{PublicKey: req.PublicKey, Identity: id, TTL: ttl})
	case modeExpired:
		return ca.Issue(localca.Leaf{PublicKey: req.PublicKey, Identity: id, NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour)})
	case modeWrongKey:
		other, err := pki.GenerateKey(pki.ECP256)
		if err != nil {
			return nil, err
		}
		return ca.Issue(localca.Leaf{PublicKey: other.Public(), Identity: id, TTL: ttl})
	case modeEmpty:
		return nil, nil
	}
	return dev.Sign(ctx, csr, id, ttl)
}

func (c *testCA) Close() error { return nil }

// env is a manager wired to a test CA, an observed logger and a private
// metrics registry, in the calling test's synctest bubble: the manager's
// clock is the bubble's.
type env struct {
	t     *testing.T
	clock bubbleClock
	ca    *testCA
	roots *Roots
	reg   *prometheus.Registry
	logs  *observer.ObservedLogs
	m     *Manager
	stop  func()
}

func newEnv(t *testing.T, mutate func(*Config)) *env {
	t.Helper()
	ca := newTestCA(t, time.Now)
	roots, err := secret.NewRoots(ca.ca.RootPEM(), "test")
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	e := &env{t: t, ca: ca, roots: roots, reg: prometheus.NewRegistry(), logs: logs}
	cfg := Config{
		Identity:   testID,
		CA:         ca,
		Roots:      roots,
		TTL:        time.Hour,
		Clock:      clock.RealClock{},
		Rand:       func() float64 { return 0.5 },
		Logger:     zap.New(core),
		Registerer: e.reg,
		GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	e.m, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// start runs the manager until the test ends.
func (e *env) start() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.m.Run(ctx) }()
	e.stop = func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Run returned %v", err)
		}
	}
	e.t.Cleanup(e.stop)
}

func (e *env) secret(name string) *Secret {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := e.m.Secret(ctx, own, name)
	if err != nil {
		e.t.Fatalf("Secret(%q): %v", name, err)
	}
	return s
}

// waitTimer waits until everything in the bubble waits: the manager, on
// its timer.
func (e *env) waitTimer() { synctest.Wait() }

// step moves the bubble's clock on by d once everything waits, and lets
// what fell due run.
func (e *env) step(d time.Duration) { e.clock.Step(d) }

// bubbleClock is the clock of a test's synctest bubble as the tests move
// it.
type bubbleClock struct{}

func (bubbleClock) Now() time.Time                  { return time.Now() }
func (bubbleClock) Since(t time.Time) time.Duration { return time.Since(t) }

// Step waits until everything in the bubble waits, moves time on by d and
// waits again, so that what fell due has run.
func (bubbleClock) Step(d time.Duration) { bubbleStep(d) }

// settled checks cond once everything in the bubble waits: what does not
// hold then does not before time moves.
func settled(t *testing.T, what string, cond func() bool) {
	t.Helper()
	synctest.Wait()
	if !cond() {
		t.Fatalf("not so once everything waits: %s", what)
	}
}

func bubbleStep(d time.Duration) {
	synctest.Wait()
	time.Sleep(d)
	synctest.Wait()
}

// waitSignal checks that ch was signalled once everything in the bubble
// waits: a signal not sent then is not coming before time moves.
func waitSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	synctest.Wait()
	select {
	case <-ch:
	default:
		t.Fatalf("no signal: %s", what)
	}
}

// noSignal checks that ch was not signalled once everything in the bubble
// waits.
func noSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	synctest.Wait()
	select {
	case <-ch:
		t.Fatalf("unexpected signal: %s", what)
	default:
	}
}

// metricValue returns the value of a counter or gauge with the given labels.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			return value(m)
		}
	}
	return 0
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}

func checkWorkloadSecret(t *testing.T, s *Secret, roots *x509.CertPool, now time.Time) {
	t.Helper()
	chain, err := pki.ParseCertificates(s.CertChain)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.ParseKeyPEM(s.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.VerifyIssued(chain, key.Public(), testID, roots, now); err != nil {
		t.Fatalf("served certificate does not verify: %v", err)
	}
	if s.Name != WorkloadCertName || s.Identity != testID || s.Leaf == nil || !s.NotAfter.Equal(chain[0].NotAfter) {
		t.Fatalf("secret fields wrong: name %q identity %s", s.Name, s.Identity)
	}
}

func TestFirstCertificateAndRoots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.start()
		s := e.secret(WorkloadCertName)
		checkWorkloadSecret(t, s, e.ca.ca.Pool(), e.clock.Now())
		if s.Source != "ca" {
			t.Errorf("source %q, want ca", s.Source)
		}
		if want := e.clock.Now().Add(30 * time.Minute); !s.RenewAt.Equal(want) {
			t.Errorf("renew at %s, want half of the 1h life: %s", s.RenewAt, want)
		}
		r := e.secret(RootCertName)
		if !r.IsRoot() || !bytes.Equal(r.Roots, e.ca.ca.RootPEM()) {
			t.Fatal("ROOTCA does not hold the CA root")
		}
		if cur, err := e.m.Current(own, WorkloadCertName); err != nil || cur != s {
			t.Fatalf("Current = %v, %v; want the certificate Secret returned", cur, err)
		}
		if err := e.m.Ready(); err != nil {
			t.Fatalf("Ready: %v", err)
		}
		if err := e.m.Live(); err != nil {
			t.Fatalf("Live: %v", err)
		}
		// The signing goroutine counts the renewal after it publishes.
		settled(t, "renewals{success} = 1", func() bool {
			return metricValue(t, e.reg, "meshagent_secretmanager_renewals_total", map[string]string{"result": "success"}) == 1
		})
		if got := metricValue(t, e.reg, "meshagent_secretmanager_cert_expiry_timestamp_seconds", map[string]string{"name": "default"}); got != float64(s.NotAfter.Unix()) {
			t.Errorf("expiry gauge = %v, want %d", got, s.NotAfter.Unix())
		}
		certs := e.m.Certs()
		if len(certs) != 2 || certs[0].ResourceName != WorkloadCertName || certs[0].Identity != testID.String() ||
			certs[0].Serial != s.Leaf.SerialNumber.Text(16) || !certs[0].RenewAt.Equal(s.RenewAt) || certs[1].ResourceName != RootCertName {
			t.Errorf("Certs() = %+v", certs)
		}
	})
}

func TestRotationBeforeExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.TTL = 30 * time.Second })
		ch, cancel := e.m.Watch(own, WorkloadCertName)
		defer cancel()
		e.start()
		first := e.secret(WorkloadCertName)
		waitSignal(t, ch, "first certificate")

		e.step(14 * time.Second)
		e.waitTimer()
		noSignal(t, ch, "rotation before renew_at")
		if e.ca.count() != 1 {
			t.Fatalf("%d CA requests before renew_at, want 1", e.ca.count())
		}

		e.step(time.Second) // 15 s: half of the 30 s life
		waitSignal(t, ch, "rotation")
		second := e.secret(WorkloadCertName)
		if second.Version <= first.Version || !second.NotAfter.After(first.NotAfter) {
			t.Fatalf("rotation published version %d (expiry %s) after %d (expiry %s)", second.Version, second.NotAfter, first.Version, first.NotAfter)
		}
		if !e.clock.Now().Before(first.NotAfter) {
			t.Fatal("rotated only after the old certificate expired")
		}
		if bytes.Equal(first.PrivateKey, second.PrivateKey) {
			t.Error("rotation reused the private key")
		}
		checkWorkloadSecret(t, second, e.ca.ca.Pool(), e.clock.Now())
	})
}

func TestCAOutageKeepsCertificate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.TTL = time.Minute })
		ch, cancel := e.m.Watch(own, WorkloadCertName)
		defer cancel()
		e.start()
		first := e.secret(WorkloadCertName)
		waitSignal(t, ch, "first certificate")

		e.ca.setMode(modeError)
		e.step(30 * time.Second) // renew_at
		outageStart := e.clock.Now()
		for e.clock.Since(outageStart) < 20*time.Second {
			e.step(time.Second)
			if s := e.secret(WorkloadCertName); s != first {
				t.Fatalf("certificate replaced during the outage: version %d", s.Version)
			}
			if err := e.m.Ready(); err != nil {
				t.Fatalf("not ready during the outage: %v", err)
			}
		}
		e.waitTimer()
		failures := e.ca.count() - 1
		if failures < 4 {
			t.Fatalf("%d retries in 20 s of outage, want at least 4", failures)
		}
		var delays []time.Duration
		for _, entry := range e.logs.FilterMessage("certificate request failed").All() {
			delays = append(delays, entry.ContextMap()[logkeys.RetryIn].(time.Duration))
		}
		if len(delays) != failures {
			t.Fatalf("%d failure logs for %d failures", len(delays), failures)
		}
		for i := 1; i < len(delays); i++ {
			if delays[i] <= delays[i-1] || delays[i] > backoff.Default.Cap {
				t.Fatalf("retry delays %v do not grow with a cap", delays)
			}
		}
		if got := metricValue(t, e.reg, "meshagent_secretmanager_renewals_total", map[string]string{"result": "ca_error"}); got != float64(failures) {
			t.Errorf("renewals{ca_error} = %v, want %d", got, failures)
		}

		e.ca.setMode(modeOK)
		for range 60 {
			e.step(time.Second)
			e.waitTimer() // the manager has acted on the step: renewed, or set its next retry
			select {
			case <-ch:
				second := e.secret(WorkloadCertName)
				if !e.clock.Now().Before(first.NotAfter) {
					t.Fatal("renewal resumed only after expiry")
				}
				checkWorkloadSecret(t, second, e.ca.ca.Pool(), e.clock.Now())
				return
			default:
			}
		}
		t.Fatal("renewal did not resume after the CA came back")
	})
}

func TestBadAnswersRejected(t *testing.T) {
	tests := []struct {
		mode   string
		reason string
	}{
		{modeWrongSAN, "identity_mismatch"},
		{modeForeignChain, "untrusted_chain"},
		{modeExpired, "not_valid_now"},
		{modeWrongKey, "key_mismatch"},
		{modeEmpty, "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, nil)
				ch, cancel := e.m.Watch(own, WorkloadCertName)
				defer cancel()
				e.start()
				first := e.secret(WorkloadCertName)
				waitSignal(t, ch, "first certificate")

				e.ca.setMode(tt.mode)
				e.step(30 * time.Minute)
				e.waitTimer() // backoff after the rejection
				noSignal(t, ch, "a bad answer was published")
				if s := e.secret(WorkloadCertName); s != first {
					t.Fatal("a bad answer replaced the certificate")
				}
				logs := e.logs.FilterMessage("CA answer rejected").All()
				if len(logs) != 1 || logs[0].ContextMap()[logkeys.Reason] != tt.reason {
					t.Fatalf("rejection logs %v, want one with reason %s", logs, tt.reason)
				}
				if got := metricValue(t, e.reg, "meshagent_ca_answers_rejected_total", map[string]string{"reason": tt.reason}); got != 1 {
					t.Errorf("meshagent_ca_answers_rejected_total{reason=%q} = %v, want 1", tt.reason, got)
				}

				e.ca.setMode(modeOK)
				e.step(time.Second)
				waitSignal(t, ch, "renewal after the CA answers well again")
				checkWorkloadSecret(t, e.secret(WorkloadCertName), e.ca.ca.Pool(), e.clock.Now())
			})
		})
	}
}

func TestBadFirstAnswerKeepsNotReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.ca.setMode(modeWrongSAN)
		e.start()
		e.waitTimer()
		err := e.m.Ready()
		if !errors.Is(err, ErrNoCertificate) {
			t.Fatalf("Ready = %v, want ErrNoCertificate", err)
		}
		if e.m.Live() != nil {
			t.Fatal("not live while waiting for the first certificate")
		}
		ctx, cancel := context.WithDeadline(context.Background(), time.Now()) // already over: Secret must not wait
		defer cancel()
		_, err = e.m.Secret(ctx, own, WorkloadCertName)
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrRejected) || !errors.Is(err, pki.ErrIdentityMismatch) {
			t.Fatalf("Secret = %v, want a deadline error wrapping the last rejection", err)
		}
		// Current never waits, whatever its context: it says why there is none.
		_, err = e.m.Current(own, WorkloadCertName)
		if !errors.Is(err, ErrNoCertificate) || !errors.Is(err, ErrRejected) {
			t.Fatalf("Current = %v, want ErrNoCertificate wrapping the last rejection", err)
		}
		if r, err := e.m.Current(own, RootCertName); err != nil || !r.IsRoot() {
			t.Fatalf("Current(ROOTCA) = %v, %v", r, err)
		}
	})
}

func TestConcurrentCallersShareOneRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		release := e.ca.holdRequests()
		e.start()
		synctest.Wait()
		select {
		case <-e.ca.entered:
		default:
			t.Fatal("no CA request")
		}
		const callers = 100
		results := make(chan *Secret, callers)
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				s, err := e.m.Secret(ctx, own, WorkloadCertName)
				if err != nil {
					t.Error(err)
				}
				results <- s
			})
		}
		settled(t, "every caller waiting", func() bool { return e.m.waiting(testID) == callers })
		release()
		wg.Wait()
		close(results)
		var first *Secret
		for s := range results {
			if first == nil {
				first = s
			}
			if s == nil || s != first {
				t.Fatal("callers got different secrets")
			}
		}
		if got := e.ca.count(); got != 1 {
			t.Fatalf("%d CA requests for %d callers, want 1", got, callers)
		}
	})
}

func TestRootChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		rootCh, cancelRoot := e.m.Watch(own, RootCertName)
		defer cancelRoot()
		certCh, cancelCert := e.m.Watch(own, WorkloadCertName)
		defer cancelCert()
		e.start()
		first := e.secret(WorkloadCertName)
		waitSignal(t, certCh, "first certificate")
		oldRoot := e.secret(RootCertName)

		// A second root is added: ROOTCA is pushed, the certificate still chains.
		next := newCA(t, localca.Config{Name: "next", Intermediate: true, Now: e.clock.Now})
		both := append(append([]byte{}, e.ca.ca.RootPEM()...), next.RootPEM()...)
		if err := e.roots.Set(both, "test"); err != nil {
			t.Fatal(err)
		}
		waitSignal(t, rootCh, "ROOTCA after a root was added")
		r := e.secret(RootCertName)
		if r.Version <= oldRoot.Version || !bytes.Equal(r.Roots, both) {
			t.Fatal("ROOTCA does not hold both roots")
		}
		e.waitTimer()
		noSignal(t, certCh, "renewal while the certificate still chains")

		// The old root is removed and the CA now signs from the new one: the
		// certificate no longer chains, so it is renewed at once.
		e.ca.setCA(next)
		if err := e.roots.Set(next.RootPEM(), "test"); err != nil {
			t.Fatal(err)
		}
		waitSignal(t, rootCh, "ROOTCA after the old root was removed")
		waitSignal(t, certCh, "renewal under the new root")
		second := e.secret(WorkloadCertName)
		if second == first {
			t.Fatal("certificate not renewed")
		}
		checkWorkloadSecret(t, second, next.Pool(), e.clock.Now())
	})
}

// A CRL set on the roots is pushed in ROOTCA with the same bundle, and a
// later root change keeps it.
func TestRootCRLChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		rootCh, cancelRoot := e.m.Watch(own, RootCertName)
		defer cancelRoot()
		e.start()
		old := e.secret(RootCertName)
		if old.CRL != nil {
			t.Fatalf("ROOTCA has a CRL before one was set: %q", old.CRL)
		}
		e.roots.SetCRL([]byte("crl PEM"))
		waitSignal(t, rootCh, "ROOTCA after the CRL was set")
		r := e.secret(RootCertName)
		if r.Version <= old.Version || string(r.CRL) != "crl PEM" || !r.Bundle.Equal(old.Bundle) {
			t.Fatalf("ROOTCA after SetCRL: version %d (was %d), CRL %q", r.Version, old.Version, r.CRL)
		}
		next := newCA(t, localca.Config{Name: "next", Now: e.clock.Now})
		both := append(append([]byte{}, e.ca.ca.RootPEM()...), next.RootPEM()...)
		if err := e.roots.Set(both, "test"); err != nil {
			t.Fatal(err)
		}
		waitSignal(t, rootCh, "ROOTCA after a root was added")
		if r := e.secret(RootCertName); string(r.CRL) != "crl PEM" || len(r.Bundle.Certs()) != 2 {
			t.Fatalf("ROOTCA after a root change: %d roots, CRL %q", len(r.Bundle.Certs()), r.CRL)
		}
	})
}

func issuePair(t *testing.T, ca *localca.CA, id pki.Identity, nb, na time.Time) (chainPEM, keyPEM []byte) {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.Issue(localca.Leaf{PublicKey: key.Public(), Identity: id, NotBefore: nb, NotAfter: na})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err = pki.EncodeKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return pki.EncodeCertificates(chain), keyPEM
}

func TestInitialCertificate(t *testing.T) {
	t.Run("valid is served at once and renewed on schedule", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var e *env
			e = newEnv(t, func(c *Config) {
				ca := c.CA.(*testCA)
				now := c.Clock.Now()
				chain, key := issuePair(t, ca.ca, testID, now.Add(-10*time.Minute), now.Add(50*time.Minute))
				c.Initial = &Secret{CertChain: chain, PrivateKey: key, Source: "output-certs"}
			})
			ch, cancel := e.m.Watch(own, WorkloadCertName)
			defer cancel()
			e.start()
			s := e.secret(WorkloadCertName)
			if s.Source != "output-certs" || e.ca.count() != 0 {
				t.Fatalf("initial certificate not served (source %q, %d CA requests)", s.Source, e.ca.count())
			}
			if want := e.clock.Now().Add(20 * time.Minute); !s.RenewAt.Equal(want) {
				t.Fatalf("renew at %s, want %s (half of the 1h life from NotBefore)", s.RenewAt, want)
			}
			e.step(20 * time.Minute)
			waitSignal(t, ch, "renewal of the initial certificate")
			if e.ca.count() != 1 || e.secret(WorkloadCertName).Source != "ca" {
				t.Fatal("initial certificate not renewed from the CA")
			}
		})
	})
	bad := []struct {
		name string
		make func(c *Config) *Secret
	}{
		{"other identity", func(c *Config) *Secret {
			now := c.Clock.Now()
			chain, key := issuePair(t, c.CA.(*testCA).ca, pki.SPIFFEIdentity("cluster.local", "ns1", "other"), now.Add(-time.Minute), now.Add(time.Hour))
			return &Secret{CertChain: chain, PrivateKey: key}
		}},
		{"expired", func(c *Config) *Secret {
			now := c.Clock.Now()
			chain, key := issuePair(t, c.CA.(*testCA).ca, testID, now.Add(-2*time.Hour), now.Add(-time.Hour))
			return &Secret{CertChain: chain, PrivateKey: key}
		}},
		{"mismatched key", func(c *Config) *Secret {
			now := c.Clock.Now()
			chain, _ := issuePair(t, c.CA.(*testCA).ca, testID, now.Add(-time.Minute), now.Add(time.Hour))
			_, key := issuePair(t, c.CA.(*testCA).ca, testID, now.Add(-time.Minute), now.Add(time.Hour))
			return &Secret{CertChain: chain, PrivateKey: key}
		}},
		{"truncated", func(c *Config) *Secret {
			now := c.Clock.Now()
			chain, key := issuePair(t, c.CA.(*testCA).ca, testID, now.Add(-time.Minute), now.Add(time.Hour))
			return &Secret{CertChain: chain[:len(chain)/2], PrivateKey: key}
		}},
	}
	for _, tt := range bad {
		t.Run(tt.name+" is ignored", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, func(c *Config) { c.Initial = tt.make(c) })
				if n := e.logs.FilterMessage("initial certificate ignored").Len(); n != 1 {
					t.Fatalf("%d logs about the ignored certificate, want 1", n)
				}
				e.start()
				if s := e.secret(WorkloadCertName); s.Source != "ca" || e.ca.count() != 1 {
					t.Fatalf("bad initial certificate served (source %q)", s.Source)
				}
			})
		})
	}
}

func TestPublishWithoutCA(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var published []*Secret
		var pmu sync.Mutex
		e := newEnv(t, func(c *Config) {
			c.CA = nil
			c.Identity = pki.Identity{}
			c.OnPublish = func(s *Secret) { pmu.Lock(); published = append(published, s); pmu.Unlock() }
		})
		ch, cancel := e.m.Watch(own, WorkloadCertName)
		defer cancel()
		e.start()
		now := e.clock.Now()
		chain, key := issuePair(t, e.ca.ca, testID, now.Add(-time.Minute), now.Add(10*time.Minute))

		if err := e.m.Publish(&Secret{Name: WorkloadCertName, CertChain: chain, PrivateKey: []byte("half a key")}); err == nil {
			t.Fatal("Publish accepted a broken key")
		}
		if err := e.m.Publish(&Secret{Name: WorkloadCertName, CertChain: chain, PrivateKey: key, Source: "file"}); err != nil {
			t.Fatal(err)
		}
		waitSignal(t, ch, "published certificate")
		s := e.secret(WorkloadCertName)
		if s.Identity != testID || s.Source != "file" || !s.RenewAt.IsZero() {
			t.Fatalf("published secret: identity %s source %q renew %s", s.Identity, s.Source, s.RenewAt)
		}
		if err := e.m.Publish(&Secret{Name: WorkloadCertName, CertChain: chain, PrivateKey: key}); err != nil {
			t.Fatal(err)
		}
		noSignal(t, ch, "publishing the same pair again")
		_, otherKey := issuePair(t, e.ca.ca, testID, now.Add(-time.Minute), now.Add(time.Hour))
		if err := e.m.Publish(&Secret{Name: WorkloadCertName, CertChain: chain, PrivateKey: otherKey}); !errors.Is(err, pki.ErrKeyMismatch) {
			t.Fatalf("Publish of a mismatched pair: %v", err)
		}
		if e.secret(WorkloadCertName) != s {
			t.Fatal("a rejected pair replaced the certificate")
		}
		if err := e.m.Publish(&Secret{Name: RootCertName}); err == nil {
			t.Fatal("Publish accepted ROOTCA")
		}
		if err := e.m.Publish(&Secret{Name: "nope"}); !errors.Is(err, ErrUnknownResource) {
			t.Fatalf("Publish of an unknown name: %v", err)
		}

		// Expiry: not live, not ready, and the expired certificate is not served.
		e.clock.Step(11 * time.Minute)
		if err := e.m.Live(); !errors.Is(err, ErrExpired) {
			t.Fatalf("Live after expiry = %v", err)
		}
		if err := e.m.Ready(); !errors.Is(err, ErrExpired) {
			t.Fatalf("Ready after expiry = %v", err)
		}
		ctx, cancelCtx := context.WithDeadline(context.Background(), time.Now())
		defer cancelCtx()
		if _, err := e.m.Secret(ctx, own, WorkloadCertName); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Secret of an expired certificate = %v", err)
		}
		// Run announces what it holds when it starts, which may come before or
		// after the Publish above; nothing else may be handed over.
		settled(t, "Run announcing the roots", func() bool {
			pmu.Lock()
			defer pmu.Unlock()
			return slices.ContainsFunc(published, func(p *Secret) bool { return p.Name == RootCertName })
		})
		pmu.Lock()
		defer pmu.Unlock()
		var sawCert, sawRoots bool
		for _, p := range published {
			switch {
			case p == s:
				sawCert = true
			case p.Name == RootCertName:
				sawRoots = true
			default:
				t.Fatalf("OnPublish saw %s version %d", p.Name, p.Version)
			}
		}
		if !sawCert || !sawRoots {
			t.Fatalf("OnPublish missed the certificate (%v) or the roots (%v)", sawCert, sawRoots)
		}

		withCA := newEnv(t, nil)
		if err := withCA.m.Publish(&Secret{Name: WorkloadCertName, CertChain: chain, PrivateKey: key}); !errors.Is(err, ErrManagedByCA) {
			t.Fatalf("Publish with a CA = %v", err)
		}
	})
}

type staticProvider struct {
	h       notify.Set
	secrets map[string]*Secret
}

func (p *staticProvider) Secret(_ context.Context, name string) (*Secret, error) {
	if s, ok := p.secrets[name]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("%w: %s", ErrUnknownResource, name)
}

func (p *staticProvider) Current(name string) (*Secret, error) {
	return p.Secret(context.Background(), name)
}

func (p *staticProvider) Watch(string) (<-chan struct{}, func()) {
	ch := p.h.Add()
	return ch, func() { p.h.Remove(ch) }
}

func TestNamesAndProviders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fileRoot := &Secret{Name: "file-root:/etc/roots.pem", Roots: []byte("x")}
		p := &staticProvider{h: notify.Set{}, secrets: map[string]*Secret{fileRoot.Name: fileRoot}}
		e := newEnv(t, func(c *Config) { c.Providers = map[string]Provider{FileRootPrefix: p} })
		ctx := context.Background()
		if s, err := e.m.Secret(ctx, own, fileRoot.Name); err != nil || s != fileRoot {
			t.Fatalf("provider secret: %v", err)
		}
		if s, err := e.m.Current(own, fileRoot.Name); err != nil || s != fileRoot {
			t.Fatalf("provider's current secret: %v", err)
		}
		ch, cancel := e.m.Watch(own, fileRoot.Name)
		defer cancel()
		p.h.Signal()
		waitSignal(t, ch, "provider watch")
		for _, name := range []string{"", "Default", "rootca", "file-cert:/a~/b", "file-root:/missing", "default ", string([]byte{0xff, 0})} {
			if _, err := e.m.Secret(ctx, own, name); !errors.Is(err, ErrUnknownResource) {
				t.Errorf("Secret(%q) = %v, want ErrUnknownResource", name, err)
			}
			if _, err := e.m.Current(own, name); !errors.Is(err, ErrUnknownResource) {
				t.Errorf("Current(%q) = %v, want ErrUnknownResource", name, err)
			}
		}
		if ch, cancel := e.m.Watch(own, "nope"); ch != nil {
			t.Error("Watch of an unknown name returned a channel")
		} else {
			cancel()
		}
	})
}

func TestConfigChecks(t *testing.T) {
	ca := newCA(t, localca.Config{})
	roots, err := secret.NewRoots(ca.RootPEM(), "test")
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := devca.New(devca.Config{CA: ca})
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no roots", Config{Identity: testID, CA: dev, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}, "secret manager: no trust roots"},
		{"malformed identity", Config{Identity: pki.Identity{SPIFFEID: "http://x"}, CA: dev, Roots: roots, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}, `secret manager: workload identity: SPIFFE ID "http://x"`},
		{"ratio above 1 is refused, not clamped", Config{Identity: testID, CA: dev, Roots: roots, GraceRatio: 1.0001, TTL: 24 * time.Hour, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}, "GraceRatio 1.0001 is outside (0, 1]"},
		{"ratio above 1", Config{Identity: testID, CA: dev, Roots: roots, GraceRatio: 1.5, TTL: 24 * time.Hour, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}, "GraceRatio 1.5 is outside (0, 1]"},
		{"jitter above 1", Config{Identity: testID, CA: dev, Roots: roots, GraceJitter: 2, TTL: 24 * time.Hour, GraceRatio: 0.5, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}, "GraceJitter 2 is outside [0, 1]"},
		{"clamp not a range", Config{Identity: testID, CA: dev, Roots: roots, MinRenewDelay: time.Hour, MaxRenewDelay: time.Minute, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}, "renewal delay clamp [1h0m0s, 1m0s] is not a range"},
		{"tiny TTL", Config{Identity: testID, CA: dev, Roots: roots, TTL: time.Millisecond, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}, "TTL 1ms is shorter than a second"},
		{"empty provider prefix", Config{Identity: testID, CA: dev, Roots: roots, Providers: map[string]Provider{"": &staticProvider{}}, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}, `provider for prefix "": empty prefix or nil provider`},
		{"provider shadows default", Config{Identity: testID, CA: dev, Roots: roots, Providers: map[string]Provider{"default": &staticProvider{}}, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}, `provider prefix "default" shadows a built-in resource`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want an error saying %q", err, tt.want)
			}
		})
	}
	// A manager made again on one registry shares the metrics registered
	// first; a metric of the same name defined otherwise is refused.
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Identity: testID, CA: dev, Roots: roots, Registerer: reg, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Identity: testID, CA: dev, Roots: roots, Registerer: reg, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}); err != nil {
		t.Fatalf("a second manager on one registry: %v", err)
	}
	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_secretmanager_identities", Help: "another definition"}))
	if _, err := New(Config{Identity: testID, CA: dev, Roots: roots, Registerer: other, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute}); err == nil {
		t.Fatal("a conflicting metric definition went unnoticed")
	}
}

func TestRunTwiceAndStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.start()
		e.secret(WorkloadCertName)
		if err := e.m.Run(context.Background()); !errors.Is(err, ErrRunning) {
			t.Fatalf("second Run = %v", err)
		}
	})
}

func FuzzPublish(f *testing.F) {
	ca := newCA(f, localca.Config{})
	key, _ := pki.GenerateKey(pki.ECP256)
	chain, _ := ca.Issue(localca.Leaf{PublicKey: key.Public(), Identity: testID})
	keyPEM, _ := pki.EncodeKeyPEM(key)
	chainPEM := pki.EncodeCertificates(chain)
	f.Add(chainPEM, keyPEM)
	f.Add(chainPEM[:100], keyPEM)
	f.Add(keyPEM, chainPEM)
	f.Add([]byte{}, []byte{})
	roots, _ := secret.NewRoots(ca.RootPEM(), "fuzz")
	m, err := New(Config{Roots: roots, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, chainData, keyData []byte) {
		err := m.Publish(&Secret{Name: WorkloadCertName, CertChain: chainData, PrivateKey: keyData})
		if err != nil {
			return
		}
		s, err := m.Secret(context.Background(), own, WorkloadCertName)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := pki.ParseCertificates(s.CertChain)
		if err != nil {
			t.Fatal(err)
		}
		k, err := pki.ParseKeyPEM(s.PrivateKey)
		if err != nil || !pki.PublicKeysEqual(k.Public(), leaf[0].PublicKey) {
			t.Fatal("published a pair whose key does not match")
		}
	})
}

// waiting returns the number of callers blocked in Secret for id.
func (m *Manager) waiting(id pki.Identity) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil {
		return e.waiters
	}
	return 0
}

package secretmanager

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/internal/backoff"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

// Defaults of Config.
const (
	DefaultTTL         = 24 * time.Hour
	DefaultGraceRatio  = 0.5
	DefaultGraceJitter = 0.01
	DefaultBackoffBase = 500 * time.Millisecond
	DefaultBackoffCap  = 60 * time.Second
	DefaultSignTimeout = time.Minute
	// DefaultMaxConcurrentCSRs bounds the CSRs in flight across identities
	// (MESHAGENT_CA_MAX_CONCURRENT_CSRS).
	DefaultMaxConcurrentCSRs = 8
	// DefaultIdleGrace is how long an identity nobody uses is kept.
	DefaultIdleGrace = time.Minute
)

var (
	// ErrNoCertificate is wrapped by Ready while no workload certificate is held.
	ErrNoCertificate = errors.New("no workload certificate yet")
	// ErrExpired is wrapped by Ready and Live once the held certificate expired.
	ErrExpired = errors.New("workload certificate expired")
	// ErrRejected is wrapped, together with the pki error saying why, by
	// errors for a CA answer that failed the checks of SPEC 6.
	ErrRejected = errors.New("CA answer rejected")
	// ErrManagedByCA is returned by Publish for the workload certificate when
	// a CA client manages it.
	ErrManagedByCA = errors.New("the workload certificate is managed by the CA client")
	// ErrRunning is returned by a second concurrent Run.
	ErrRunning = errors.New("secret manager is already running")
	// ErrNoIdentity is wrapped by errors for a request of "default" that names
	// no identity the manager can serve: no caller identity and no configured
	// one, or a caller identity without a CA to sign it.
	ErrNoIdentity = errors.New("no workload identity for this caller")
)

// Provider serves the resource names under a prefix that the manager does not
// hold itself (file-cert:..., file-root:...). Its secrets carry the requested
// name.
type Provider interface {
	// Secret returns the current secret for name, waiting for it if needed
	// (bounded by ctx). Names it cannot serve give an error wrapping
	// ErrUnknownResource.
	Secret(ctx context.Context, name string) (*Secret, error)
	// Watch signals changes of name on a channel with a one-slot buffer; the
	// function ends the subscription. A nil channel refuses the name (it
	// cannot be loaded, or over a limit); a later Secret may still load it
	// once, so a consumer that watches must refuse the name itself (sds
	// does) rather than serve what it cannot follow.
	Watch(name string) (<-chan struct{}, func())
}

// Config describes a Manager. Zero values get the defaults noted.
type Config struct {
	// Identity is the agent's own workload identity: what "default" means
	// for a caller that carries none (caller.Info.Identity empty). It is
	// kept fresh whether or not anyone asks, and never dropped. Zero with a
	// CA means the manager serves only callers that carry an identity (node
	// mode).
	Identity pki.Identity
	// KeyType of the workload keys; a new key is made for every request.
	// Default pki.ECP256.
	KeyType pki.KeyType
	// CA signs the workload certificates. Nil means the workload certificate
	// comes only from Initial and Publish (file-mounted certificates).
	CA caclient.Client
	// Roots is the trust bundle: served as ROOTCA, and every CA answer must
	// chain to it. Required. A change is pushed to ROOTCA subscribers, and a
	// held certificate that no longer chains to it is renewed at once.
	Roots RootSource
	// TTL is the lifetime asked of the CA (SECRET_TTL). Default 24h.
	TTL time.Duration
	// GraceRatio (SECRET_GRACE_PERIOD_RATIO) is the share of life left at
	// renewal, in (0, 1]. Default 0.5; Linkerd uses 0.3. RenewalFloor bounds
	// how soon after arrival a certificate is renewed, whatever the ratio.
	GraceRatio float64
	// GraceJitter (SECRET_GRACE_PERIOD_RATIO_JITTER), in [0, 1]. Default 0.01;
	// a negative value means no jitter.
	GraceJitter float64
	// MinRenewDelay and MaxRenewDelay clamp the time from arrival to renewal
	// (Linkerd: 10s and 24h). Zero means no clamp.
	MinRenewDelay, MaxRenewDelay time.Duration
	// BackoffBase is the first wait after a failed request of an identity; it
	// doubles per failure of that identity up to BackoffCap, with jitter.
	// Defaults 500ms and 60s.
	BackoffBase, BackoffCap time.Duration
	// SignTimeout bounds one CA request. Default 1m; negative means no bound.
	SignTimeout time.Duration
	// MaxConcurrentCSRs bounds the CA requests in flight across identities
	// (MESHAGENT_CA_MAX_CONCURRENT_CSRS). Default DefaultMaxConcurrentCSRs.
	MaxConcurrentCSRs int
	// IdleGrace is how long an identity with no subscriber, no waiting
	// caller and no Prefetch is kept before it is dropped. Default
	// DefaultIdleGrace.
	IdleGrace time.Duration
	// Clock times renewals, backoff, idleness and validity. Default the real
	// clock.
	Clock clock.Clock
	// Rand returns a uniform number in [0, 1) for the jitters. Default
	// math/rand/v2.Float64. Calls are serialised by the manager.
	Rand func() float64
	// Initial seeds the own identity's certificate (OUTPUT_CERTS after a
	// restart): CertChain and PrivateKey PEM, Source. It is used only when it
	// is valid now, matches the key and, with a CA, is for Identity and
	// chains to Roots; otherwise it is logged and ignored. It is renewed on
	// schedule as if it had arrived at its NotBefore.
	Initial *Secret
	// Providers serve other resource names, keyed by name prefix (for example
	// FileCertPrefix); the longest matching prefix wins.
	Providers map[string]Provider
	// OnPublish, when set, is called with every secret of the own identity
	// and every ROOTCA the manager publishes, in publication order, before
	// subscribers are signalled; when Run starts it is called with those
	// already held. It must not block for long nor modify the secret.
	// Certificates of other identities (node mode) are not handed over.
	OnPublish func(*Secret)
	// Source labels the workload certificates in Secret.Source and
	// /debug/certs. Default "ca", or "file" without a CA.
	Source string
	// Logger receives the manager's logs. Nil means no logs.
	Logger *zap.Logger
	// Registerer receives the metrics. Nil means they are not registered.
	Registerer prometheus.Registerer
}

// held is a workload certificate in service. It is never modified.
type held struct {
	secret *Secret
	chain  []*x509.Certificate
}

// priority orders the identities that are due when fewer CSR slots are free
// than identities wait for one.
type priority int

const (
	// prioRenewal: a valid certificate is held; this is its scheduled
	// renewal (or a retry of it).
	prioRenewal priority = iota
	// prioWarmup: no valid certificate yet, but nobody blocks on it (a
	// subscriber, Prefetch, the own identity at start-up).
	prioWarmup
	// prioWaiting: a caller is blocked in Secret for this identity.
	prioWaiting
)

// entry is the state of one identity. It is guarded by Manager.mu.
type entry struct {
	id  pki.Identity
	own bool // the configured identity: never dropped, handed to OnPublish

	cert     *held     // the certificate in service; nil before the first
	lastErr  error     // of the last request, nil after a success
	inFlight bool      // a CSR for it is out
	due      time.Time // when the next request may start (zero: now)
	failures int       // consecutive failed requests: its own backoff

	gen uint64 // bumped at every (re)queueing: older queue items are stale

	subs      map[chan struct{}]struct{} // Watch subscribers and waiting callers
	waiters   int                        // callers blocked in Secret
	pins      int                        // Prefetch holds
	idleSince time.Time                  // when it last became unused
}

// used reports whether anyone holds on to the entry.
func (e *entry) used() bool { return e.own || e.pins > 0 || len(e.subs) > 0 }

// valid returns the certificate if one is held and has not expired at now.
func (e *entry) valid(now time.Time) *Secret {
	if e.cert != nil && now.Before(e.cert.secret.NotAfter) {
		return e.cert.secret
	}
	return nil
}

func (e *entry) priority(now time.Time) priority {
	switch {
	case e.valid(now) != nil:
		return prioRenewal
	case e.waiters > 0:
		return prioWaiting
	default:
		return prioWarmup
	}
}

// notify signals every subscriber of e without blocking. Called with mu held.
func (e *entry) notify() {
	for ch := range e.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Manager holds the workload certificates of any number of identities and
// the trust bundle, renews each certificate from the CA on the schedule of
// SPEC 8, and signals subscribers when a secret changes. Create it with New
// and start it with Run.
type Manager struct {
	cfg     Config
	policy  Policy
	backoff backoff.Policy
	log     *zap.Logger
	metrics *metrics
	clock   clock.Clock

	randMu sync.Mutex

	running atomic.Bool
	// wake tells Run to look at the entries again (one slot; signals merge).
	wake chan struct{}

	// pubMu serialises publications so that OnPublish and the subscribers
	// see secrets in version order. Lock order: pubMu, then mu.
	pubMu sync.Mutex

	mu          sync.Mutex
	entries     map[pki.Identity]*entry
	own         *entry       // nil when no own identity is configured
	timers      heap[timed]  // entries by due time
	ready       heap[ranked] // due entries waiting for a CSR slot, best first
	idle        heap[timed]  // unused entries by the time they may be dropped
	inFlight    int
	version     uint64
	roots       *Secret
	rootsBundle *Bundle
	rootSubs    map[chan struct{}]struct{}
}

// New checks cfg, fills in defaults and returns a Manager. It starts nothing.
func New(cfg Config) (*Manager, error) {
	if cfg.Roots == nil {
		return nil, errors.New("secret manager: no trust roots")
	}
	if !cfg.Identity.IsZero() {
		if err := cfg.Identity.Validate(); err != nil {
			return nil, fmt.Errorf("secret manager: workload identity: %w", err)
		}
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("secret manager: TTL %s is shorter than a second", cfg.TTL)
	}
	if cfg.GraceRatio == 0 {
		cfg.GraceRatio = DefaultGraceRatio
	}
	switch {
	case cfg.GraceJitter == 0:
		cfg.GraceJitter = DefaultGraceJitter
	case cfg.GraceJitter < 0:
		cfg.GraceJitter = 0
	}
	if !(cfg.GraceRatio > 0 && cfg.GraceRatio <= 1) {
		return nil, fmt.Errorf("secret manager: grace ratio %v is outside (0, 1]", cfg.GraceRatio)
	}
	if !(cfg.GraceJitter <= 1) {
		return nil, fmt.Errorf("secret manager: grace jitter %v is outside [0, 1]", cfg.GraceJitter)
	}
	if cfg.MinRenewDelay < 0 || cfg.MaxRenewDelay < 0 || (cfg.MaxRenewDelay > 0 && cfg.MaxRenewDelay < cfg.MinRenewDelay) {
		return nil, fmt.Errorf("secret manager: renewal delay clamp [%s, %s] is not a range", cfg.MinRenewDelay, cfg.MaxRenewDelay)
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffCap <= 0 {
		cfg.BackoffCap = DefaultBackoffCap
	}
	cfg.BackoffCap = max(cfg.BackoffCap, cfg.BackoffBase)
	switch {
	case cfg.SignTimeout == 0:
		cfg.SignTimeout = DefaultSignTimeout
	case cfg.SignTimeout < 0:
		cfg.SignTimeout = 0
	}
	if cfg.MaxConcurrentCSRs <= 0 {
		cfg.MaxConcurrentCSRs = DefaultMaxConcurrentCSRs
	}
	if cfg.IdleGrace <= 0 {
		cfg.IdleGrace = DefaultIdleGrace
	}
	for prefix, p := range cfg.Providers {
		if prefix == "" || p == nil {
			return nil, fmt.Errorf("secret manager: provider for prefix %q: empty prefix or nil provider", prefix)
		}
		if prefix == WorkloadCertName || prefix == RootCertName {
			return nil, fmt.Errorf("secret manager: provider prefix %q shadows a built-in resource", prefix)
		}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Source == "" {
		cfg.Source = "ca"
		if cfg.CA == nil {
			cfg.Source = "file"
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg: cfg,
		policy: Policy{
			GraceRatio:  cfg.GraceRatio,
			GraceJitter: cfg.GraceJitter,
			MinDelay:    cfg.MinRenewDelay,
			MaxDelay:    cfg.MaxRenewDelay,
		},
		backoff:  backoff.Policy{Base: cfg.BackoffBase, Cap: cfg.BackoffCap},
		log:      cfg.Logger.Named("secretmanager"),
		metrics:  met,
		clock:    cfg.Clock,
		wake:     make(chan struct{}, 1),
		entries:  make(map[pki.Identity]*entry),
		timers:   heap[timed]{less: timedLess},
		ready:    heap[ranked]{less: rankedLess},
		idle:     heap[timed]{less: timedLess},
		rootSubs: make(map[chan struct{}]struct{}),
	}
	b := cfg.Roots.Bundle()
	if b == nil {
		return nil, errors.New("secret manager: root source has no bundle")
	}
	m.version++
	m.roots, m.rootsBundle = rootSecret(b, m.version), b
	if !cfg.Identity.IsZero() || cfg.CA == nil {
		// Without a CA the own entry holds whatever Publish brings, whose
		// identity is read from the certificate.
		m.own = m.entryLocked(cfg.Identity, m.clock.Now())
		m.own.own = true
	}
	if cfg.Initial != nil && m.own != nil {
		m.loadInitial(cfg.Initial)
	}
	return m, nil
}

func (m *Manager) loadInitial(in *Secret) {
	h, err := m.checkPair(in.CertChain, in.PrivateKey, m.cfg.CA != nil)
	if err != nil {
		m.log.Warn("initial certificate ignored", zap.String(keySource, in.Source), zap.String(keyReason, pki.Reason(err)), zap.Error(err))
		return
	}
	if in.Source != "" {
		h.secret.Source = in.Source
	}
	if m.cfg.CA != nil {
		h.secret.RenewAt = RenewAt(h.chain[0].NotBefore, h.secret.NotAfter, m.policy, m.rand())
		m.own.due = h.secret.RenewAt
		m.enqueueLocked(m.own)
	}
	m.version++
	h.secret.Version = m.version
	m.own.cert = h
	m.log.Info("initial certificate loaded", certFields(h.secret)...)
}

func rootSecret(b *Bundle, version uint64) *Secret {
	return &Secret{Name: RootCertName, Roots: b.PEM, CRL: b.CRL, NotAfter: b.NotAfter, Source: b.Source, Version: version}
}

func (m *Manager) rand() float64 {
	m.randMu.Lock()
	defer m.randMu.Unlock()
	return m.cfg.Rand()
}

// poke asks Run to look at the entries again. It never blocks.
func (m *Manager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// entryLocked returns the entry of id, making it if needed. Called with mu
// held (or before the manager is shared).
func (m *Manager) entryLocked(id pki.Identity, now time.Time) *entry {
	if e := m.entries[id]; e != nil {
		return e
	}
	e := &entry{id: id, subs: make(map[chan struct{}]struct{})}
	m.entries[id] = e
	m.metrics.identities.Set(float64(len(m.entries)))
	m.enqueueLocked(e)
	m.released(e, now)
	return e
}

// enqueueLocked (re)queues e at its due time; items queued for it before
// are stale from now on. Called with mu held whenever e's due time or its
// claim on a slot changes: made, used again, finished, roots changed.
func (m *Manager) enqueueLocked(e *entry) {
	if m.cfg.CA == nil {
		return // nothing is ever requested
	}
	e.gen++
	m.timers.push(timed{e: e, gen: e.gen, at: e.due})
}

// acquired records that someone took hold of e (a subscriber, a waiting
// caller, a Prefetch); wasUsed says whether e was in use before. Called with
// mu held, after the hold was counted. An entry used again is queued anew
// (the queues forget unused entries); one without a valid certificate too,
// since its rank may have risen. A renewal already queued stays as it is.
func (m *Manager) acquired(e *entry, wasUsed bool) {
	if !e.inFlight && (!wasUsed || e.valid(m.clock.Now()) == nil) {
		m.enqueueLocked(e)
		m.poke()
	}
}

// released records that someone let go of e. Called with mu held.
func (m *Manager) released(e *entry, now time.Time) {
	if !e.used() {
		e.idleSince = now
		m.idle.push(timed{e: e, at: now.Add(m.cfg.IdleGrace)})
		m.poke() // the sweep needs a timer for it
	}
}

// Run keeps the certificates of every identity in use fresh, drops the
// identities nobody uses and follows root changes until ctx ends (then it
// waits for the requests in flight to end and returns nil). Without a CA it
// only follows root changes. Only one Run may be active at a time.
func (m *Manager) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer m.running.Store(false)
	rootsCh, stopRoots := m.cfg.Roots.Watch()
	defer stopRoots()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	m.announce()
	if m.refreshRoots() {
		m.recheckLeaves()
	}
	for {
		next, ok := m.schedule(ctx, &wg)
		var (
			timer  clock.Timer
			timerC <-chan time.Time
		)
		if ok {
			timer = m.clock.NewTimer(max(next.Sub(m.clock.Now()), 0))
			timerC = timer.C()
		}
		select {
		case <-ctx.Done():
			stopTimer(timer)
			return nil
		case <-timerC:
		case <-m.wake:
			stopTimer(timer)
		case <-rootsCh:
			stopTimer(timer)
			if m.refreshRoots() {
				m.recheckLeaves()
			}
		}
	}
}

func stopTimer(t clock.Timer) {
	if t != nil {
		t.Stop()
	}
}

// schedule drops the entries idle past the grace period and starts a
// request for each due entry while fewer than MaxConcurrentCSRs are in
// flight: highest priority first, then earliest due. It returns when it
// must look again (ok false: only when woken). It works on three queues
// (by due time, ready by rank, idle by drop time) with lazy deletion, so a
// pass costs O(log n) per entry it moves, not a scan of every identity.
func (m *Manager) schedule(ctx context.Context, wg *sync.WaitGroup) (next time.Time, ok bool) {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	// Drop the entries unused for the grace period.
	for m.idle.len() > 0 {
		it := m.idle.peek()
		e := it.e
		if m.entries[e.id] != e || e.used() || !e.idleSince.Add(m.cfg.IdleGrace).Equal(it.at) {
			m.idle.pop() // stale: dropped already, used again, or idle since later
			continue
		}
		if it.at.After(now) {
			next, ok = it.at, true
			break
		}
		m.idle.pop()
		delete(m.entries, e.id)
		m.metrics.dropped.Inc()
		m.log.Debug("identity dropped: unused", zap.String(keyIdentity, e.id.String()))
	}
	m.metrics.identities.Set(float64(len(m.entries)))
	if m.cfg.CA == nil {
		return next, ok
	}
	// Move the entries that fell due to the ready queue, ranked now.
	for m.timers.len() > 0 {
		it := m.timers.peek()
		if it.gen != it.e.gen || !m.startable(it.e) {
			m.timers.pop()
			continue
		}
		if it.at.After(now) {
			if !ok || it.at.Before(next) {
				next, ok = it.at, true
			}
			break
		}
		m.timers.pop()
		m.ready.push(ranked{e: it.e, gen: it.gen, prio: it.e.priority(now), due: it.e.due})
	}
	// Start the best of them while slots are free; the rest wait for a
	// slot (every finished request wakes Run).
	for m.inFlight < m.cfg.MaxConcurrentCSRs && m.ready.len() > 0 {
		it := m.ready.pop()
		e := it.e
		if it.gen != e.gen || !m.startable(e) {
			continue
		}
		if p := e.priority(now); p != it.prio {
			it.prio = p // ranked when it fell due; re-rank
			m.ready.push(it)
			continue
		}
		e.inFlight = true
		m.inFlight++
		wg.Go(func() { m.sign(ctx, e) })
	}
	m.metrics.inFlight.Set(float64(m.inFlight))
	return next, ok
}

// startable reports whether a request may start for e: it is still held,
// in use and has none out. Called with mu held.
func (m *Manager) startable(e *entry) bool {
	return !e.inFlight && e.used() && m.entries[e.id] == e
}

// sign runs one request for e outside any lock and records its result.
func (m *Manager) sign(ctx context.Context, e *entry) {
	defer m.poke()
	s, h, err := m.request(ctx, e.id)
	if ctx.Err() != nil {
		m.mu.Lock()
		e.inFlight = false
		m.inFlight--
		m.mu.Unlock()
		return
	}
	m.finish(e, s, h, err)
}

// request asks the CA for a certificate for id with a new key and checks
// the answer. It takes no lock.
func (m *Manager) request(ctx context.Context, id pki.Identity) (*Secret, *held, error) {
	key, err := pki.GenerateKey(m.cfg.KeyType)
	if err != nil {
		m.metrics.renewals.WithLabelValues(resultKeyError).Inc()
		return nil, nil, fmt.Errorf("generating key: %w", err)
	}
	csr, err := pki.NewCSR(key, id)
	if err != nil {
		m.metrics.renewals.WithLabelValues(resultKeyError).Inc()
		return nil, nil, err
	}
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		m.metrics.renewals.WithLabelValues(resultKeyError).Inc()
		return nil, nil, err
	}
	sctx, cancel := ctx, context.CancelFunc(func() {})
	if m.cfg.SignTimeout > 0 {
		sctx, cancel = context.WithTimeout(ctx, m.cfg.SignTimeout)
	}
	start := time.Now()
	chain, err := m.cfg.CA.Sign(sctx, csr, id, m.cfg.TTL)
	cancel()
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	latency := time.Since(start)
	m.metrics.caLatency.Observe(latency.Seconds())
	if err != nil {
		m.metrics.renewals.WithLabelValues(resultCAError).Inc()
		return nil, nil, fmt.Errorf("requesting certificate for %s: %w", id, err)
	}
	now := m.clock.Now()
	if err := pki.VerifyIssued(chain, key.Public(), id, m.cfg.Roots.Bundle().Pool, now); err != nil {
		m.metrics.renewals.WithLabelValues(resultRejected).Inc()
		m.metrics.rejected.WithLabelValues(pki.Reason(err)).Inc()
		return nil, nil, fmt.Errorf("%w: %w", ErrRejected, err)
	}
	leaf := chain[0]
	s := &Secret{
		Name:       WorkloadCertName,
		Identity:   id,
		CertChain:  pki.EncodeCertificates(chain),
		PrivateKey: keyPEM,
		Leaf:       leaf,
		NotAfter:   leaf.NotAfter,
		RenewAt:    RenewAt(now, leaf.NotAfter, m.policy, m.rand()),
		Source:     m.cfg.Source,
	}
	m.log.Debug("CA answered", zap.String(keyIdentity, id.String()), zap.Duration(keyLatency, latency))
	return s, &held{secret: s, chain: chain}, nil
}

// finish records the result of a request for e: a new certificate is
// published, a failure sets the identity's next attempt by its backoff. A
// result for an entry dropped meanwhile is discarded.
func (m *Manager) finish(e *entry, s *Secret, h *held, err error) {
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	m.mu.Lock()
	e.inFlight = false
	m.inFlight--
	if m.entries[e.id] != e {
		m.mu.Unlock()
		if err == nil {
			m.metrics.renewals.WithLabelValues(resultDiscarded).Inc()
		}
		m.log.Debug("CA answer discarded: identity dropped meanwhile", zap.String(keyIdentity, e.id.String()))
		return
	}
	now := m.clock.Now()
	if err != nil {
		e.lastErr = err
		wait := m.backoff.Delay(e.failures, m.rand())
		e.failures++
		e.due = now.Add(wait)
		m.enqueueLocked(e)
		attempt := e.failures
		m.mu.Unlock()
		m.logFailure(e.id, err, attempt, wait)
		return
	}
	m.version++
	s.Version = m.version
	e.cert, e.lastErr, e.failures, e.due = h, nil, 0, s.RenewAt
	m.enqueueLocked(e)
	own := e.own
	m.mu.Unlock()
	m.metrics.renewals.WithLabelValues(resultSuccess).Inc()
	m.log.Info("certificate issued", certFields(s)...)
	if own {
		m.observe(s)
		if m.cfg.OnPublish != nil {
			m.cfg.OnPublish(s)
		}
	}
	m.mu.Lock()
	e.notify()
	m.mu.Unlock()
}

func (m *Manager) logFailure(id pki.Identity, err error, attempt int, retryIn time.Duration) {
	fields := []zap.Field{zap.String(keyIdentity, id.String()), zap.Int(keyAttempt, attempt), zap.Duration(keyRetryIn, retryIn), zap.Error(err)}
	if errors.Is(err, ErrRejected) {
		m.log.Warn("CA answer rejected", append([]zap.Field{zap.String(keyReason, pki.Reason(err))}, fields...)...)
		return
	}
	m.log.Warn("certificate request failed", fields...)
}

func (m *Manager) observe(s *Secret) {
	m.metrics.expiry.WithLabelValues(s.Name).Set(float64(s.NotAfter.Unix()))
	if !s.RenewAt.IsZero() {
		m.metrics.renewAt.WithLabelValues(s.Name).Set(float64(s.RenewAt.Unix()))
	}
}

// announce hands the secrets held when Run starts to OnPublish.
func (m *Manager) announce() {
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	m.mu.Lock()
	var out []*Secret
	if m.own != nil && m.own.cert != nil {
		out = append(out, m.own.cert.secret)
	}
	out = append(out, m.roots)
	m.mu.Unlock()
	for _, s := range out {
		m.observe(s)
		if m.cfg.OnPublish != nil {
			m.cfg.OnPublish(s)
		}
	}
}

// refreshRoots publishes ROOTCA anew if the root source changed, and reports
// whether it did. It touches no certificate.
func (m *Manager) refreshRoots() bool {
	b := m.cfg.Roots.Bundle()
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	m.mu.Lock()
	if b == nil || b == m.rootsBundle || (bytes.Equal(b.PEM, m.rootsBundle.PEM) && bytes.Equal(b.CRL, m.rootsBundle.CRL)) {
		m.mu.Unlock()
		return false
	}
	m.version++
	s := rootSecret(b, m.version)
	m.roots, m.rootsBundle = s, b
	m.mu.Unlock()
	m.log.Info("trust roots changed", zap.Int(keyRoots, len(b.Certs)), zap.String(keySource, b.Source))
	m.observe(s)
	if m.cfg.OnPublish != nil {
		m.cfg.OnPublish(s)
	}
	m.mu.Lock()
	notifyAll(m.rootSubs)
	m.mu.Unlock()
	return true
}

func notifyAll(subs map[chan struct{}]struct{}) {
	for ch := range subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// recheckLeaves re-verifies every held CA certificate against the current
// roots, outside the lock, and makes those that no longer chain due now.
func (m *Manager) recheckLeaves() {
	if m.cfg.CA == nil {
		return
	}
	type check struct {
		e *entry
		h *held
	}
	m.mu.Lock()
	pool := m.rootsBundle.Pool
	var checks []check
	for _, e := range m.entries {
		if e.cert != nil {
			checks = append(checks, check{e, e.cert})
		}
	}
	m.mu.Unlock()
	now := m.clock.Now()
	var stale []check
	for _, c := range checks {
		err := pki.VerifyIssued(c.h.chain, c.h.chain[0].PublicKey, c.e.id, pool, now)
		if errors.Is(err, pki.ErrUntrustedChain) {
			stale = append(stale, c)
		}
	}
	if len(stale) == 0 {
		return
	}
	m.mu.Lock()
	for _, c := range stale {
		if c.e.cert == c.h && m.entries[c.e.id] == c.e {
			c.e.due, c.e.failures = time.Time{}, 0
			if !c.e.inFlight {
				m.enqueueLocked(c.e)
			}
			m.log.Warn("certificate does not chain to the new roots; renewing", zap.String(keyIdentity, c.e.id.String()))
		}
	}
	m.mu.Unlock()
	m.poke()
}

// identityFor returns the identity "default" means for the caller of ctx:
// caller.Info.Identity when set, else the configured identity.
func (m *Manager) identityFor(ctx context.Context) (pki.Identity, error) {
	if info, ok := caller.FromContext(ctx); ok && info.Identity != "" {
		id, err := pki.ParseIdentity(info.Identity)
		if err != nil {
			return pki.Identity{}, fmt.Errorf("%w: caller identity: %w", ErrNoIdentity, err)
		}
		if m.cfg.CA == nil && (m.own == nil || m.own.id != id) {
			return pki.Identity{}, fmt.Errorf("%w: no CA to sign for %s", ErrNoIdentity, id)
		}
		return id, nil
	}
	if m.own == nil {
		return pki.Identity{}, ErrNoIdentity
	}
	return m.own.id, nil
}

// Secret returns the current secret for name. "default" is the workload
// certificate of the caller's identity (see identityFor); Secret waits,
// bounded by ctx, while none is held for it or the held one has expired, and
// with a ctx already done it returns at once. Names nobody serves give an
// error wrapping ErrUnknownResource.
func (m *Manager) Secret(ctx context.Context, name string) (*Secret, error) {
	switch name {
	case WorkloadCertName:
		return m.workloadSecret(ctx)
	case RootCertName:
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.roots, nil
	}
	if p := m.provider(name); p != nil {
		return p.Secret(ctx, name)
	}
	return nil, fmt.Errorf("%w: %.200q", ErrUnknownResource, name)
}

func (m *Manager) workloadSecret(ctx context.Context) (*Secret, error) {
	id, err := m.identityFor(ctx)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	now := m.clock.Now()
	e := m.entryLocked(id, now)
	if s := e.valid(now); s != nil {
		m.mu.Unlock()
		return s, nil
	}
	if ctx.Err() != nil {
		lastErr := e.lastErr
		m.mu.Unlock()
		return nil, waitError(id, ctx.Err(), lastErr)
	}
	ch := make(chan struct{}, 1)
	was := e.used()
	e.subs[ch] = struct{}{}
	e.waiters++
	m.acquired(e, was)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(e.subs, ch)
		e.waiters--
		m.released(e, m.clock.Now())
		m.mu.Unlock()
	}()
	for {
		select {
		case <-ch:
			m.mu.Lock()
			s := e.valid(m.clock.Now())
			m.mu.Unlock()
			if s != nil {
				return s, nil
			}
		case <-ctx.Done():
			m.mu.Lock()
			lastErr := e.lastErr
			m.mu.Unlock()
			return nil, waitError(id, ctx.Err(), lastErr)
		}
	}
}

func waitError(id pki.Identity, ctxErr, lastErr error) error {
	if lastErr != nil {
		return fmt.Errorf("waiting for the certificate of %s: %w (last error: %w)", id, ctxErr, lastErr)
	}
	return fmt.Errorf("waiting for the certificate of %s: %w", id, ctxErr)
}

// Watch returns a channel that receives a value whenever the secret under
// name (for "default": the caller's identity, as in Secret) is replaced, and
// a function that ends the subscription. The channel has a one-slot buffer
// and signals merge: after a signal, call Secret for the newest version.
// Watching "default" holds the identity: it is kept fresh, and dropped only
// once nobody watches or waits for it. For a name nobody serves, a caller
// with no identity, or a provider's name it refused to hold, the channel is
// nil (Secret says why, unless a provider's limit freed up meanwhile): the
// name must then be refused, never served unwatched.
func (m *Manager) Watch(ctx context.Context, name string) (<-chan struct{}, func()) {
	switch name {
	case WorkloadCertName:
		id, err := m.identityFor(ctx)
		if err != nil {
			return nil, func() {}
		}
		ch := make(chan struct{}, 1)
		m.mu.Lock()
		e := m.entryLocked(id, m.clock.Now())
		was := e.used()
		e.subs[ch] = struct{}{}
		m.acquired(e, was)
		m.mu.Unlock()
		var once sync.Once
		return ch, func() {
			once.Do(func() {
				m.mu.Lock()
				delete(e.subs, ch)
				m.released(e, m.clock.Now())
				m.mu.Unlock()
			})
		}
	case RootCertName:
		ch := make(chan struct{}, 1)
		m.mu.Lock()
		m.rootSubs[ch] = struct{}{}
		m.mu.Unlock()
		var once sync.Once
		return ch, func() {
			once.Do(func() {
				m.mu.Lock()
				delete(m.rootSubs, ch)
				m.mu.Unlock()
			})
		}
	}
	if p := m.provider(name); p != nil {
		return p.Watch(name)
	}
	return nil, func() {}
}

// Prefetch holds id until Release: its certificate is requested now (ahead
// of any caller, at warm-up priority) and kept fresh. Holds count: each
// Prefetch needs its own Release.
func (m *Manager) Prefetch(id pki.Identity) error {
	if err := id.Validate(); err != nil {
		return fmt.Errorf("prefetch: %w", err)
	}
	if m.cfg.CA == nil {
		return fmt.Errorf("prefetch %s: %w: no CA", id, ErrNoIdentity)
	}
	m.mu.Lock()
	e := m.entryLocked(id, m.clock.Now())
	was := e.used()
	e.pins++
	m.acquired(e, was)
	m.mu.Unlock()
	return nil
}

// Release ends one Prefetch hold of id. Once nothing holds it, the identity
// is dropped after the idle grace period.
func (m *Manager) Release(id pki.Identity) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil && e.pins > 0 {
		e.pins--
		m.released(e, m.clock.Now())
	}
}

func (m *Manager) provider(name string) Provider {
	var (
		best    Provider
		bestLen int
	)
	for prefix, p := range m.cfg.Providers {
		if len(prefix) > bestLen && strings.HasPrefix(name, prefix) {
			best, bestLen = p, len(prefix)
		}
	}
	return best
}

// Publish makes an externally loaded certificate and key (workload
// credentials or file-mounted certificates) the own workload certificate. It
// is refused when a CA manages the certificate, and when the pair does not
// parse, the key does not match or the certificate is not valid now; the
// held certificate then stays. Publishing the same pair again does nothing.
func (m *Manager) Publish(s *Secret) error {
	switch {
	case s == nil:
		return errors.New("publishing a nil secret")
	case s.Name == RootCertName:
		return errors.New("trust roots are published through the root source")
	case s.Name != WorkloadCertName:
		return fmt.Errorf("publishing %w: %.200q", ErrUnknownResource, s.Name)
	case m.cfg.CA != nil:
		return ErrManagedByCA
	}
	h, err := m.checkPair(s.CertChain, s.PrivateKey, false)
	if err != nil {
		m.log.Warn("certificate not published", zap.String(keySource, s.Source), zap.String(keyReason, pki.Reason(err)), zap.Error(err))
		return err
	}
	if s.Source != "" {
		h.secret.Source = s.Source
	}
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	m.mu.Lock()
	e := m.own
	if cur := e.cert; cur != nil && bytes.Equal(cur.secret.CertChain, h.secret.CertChain) && bytes.Equal(cur.secret.PrivateKey, h.secret.PrivateKey) {
		m.mu.Unlock()
		return nil
	}
	m.version++
	h.secret.Version = m.version
	e.cert, e.lastErr = h, nil
	m.mu.Unlock()
	m.observe(h.secret)
	if m.cfg.OnPublish != nil {
		m.cfg.OnPublish(h.secret)
	}
	m.mu.Lock()
	e.notify()
	m.mu.Unlock()
	m.log.Info("certificate published", certFields(h.secret)...)
	return nil
}

// checkPair parses a PEM chain and key and checks them. With verify, the
// leaf must be for the configured identity and chain to the roots; without,
// the identity is read from the leaf.
func (m *Manager) checkPair(chainPEM, keyPEM []byte, verify bool) (*held, error) {
	chain, err := pki.ParseCertificates(chainPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate chain: %w", err)
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing private key: %w", err)
	}
	leaf, now := chain[0], m.clock.Now()
	id := m.cfg.Identity
	if verify {
		if err := pki.VerifyIssued(chain, key.Public(), id, m.cfg.Roots.Bundle().Pool, now); err != nil {
			return nil, err
		}
	} else {
		if !pki.PublicKeysEqual(key.Public(), leaf.PublicKey) {
			return nil, pki.ErrKeyMismatch
		}
		if now.Before(leaf.NotBefore) || !now.Before(leaf.NotAfter) {
			return nil, fmt.Errorf("%w: valid from %s to %s", pki.ErrNotValidNow, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
		}
		id, _ = pki.IdentityOf(leaf)
	}
	normKey, err := pki.EncodeKeyPEM(key)
	if err != nil {
		return nil, err
	}
	s := &Secret{
		Name:       WorkloadCertName,
		Identity:   id,
		CertChain:  pki.EncodeCertificates(chain),
		PrivateKey: normKey,
		Leaf:       leaf,
		NotAfter:   leaf.NotAfter,
		Source:     m.cfg.Source,
	}
	return &held{secret: s, chain: chain}, nil
}

// Ready returns nil while the own identity holds a certificate that has not
// expired, else an error saying why (wrapping ErrNoCertificate or
// ErrExpired). Without an own identity (node mode) it is nil.
func (m *Manager) Ready() error {
	if m.own == nil {
		return nil
	}
	m.mu.Lock()
	h, lastErr := m.own.cert, m.own.lastErr
	m.mu.Unlock()
	if h == nil {
		if lastErr != nil {
			return fmt.Errorf("%w (last error: %w)", ErrNoCertificate, lastErr)
		}
		return ErrNoCertificate
	}
	return m.expired(h)
}

// Live returns an error once the own identity's certificate has expired. It
// is nil while the first certificate is awaited.
func (m *Manager) Live() error {
	if m.own == nil {
		return nil
	}
	m.mu.Lock()
	h := m.own.cert
	m.mu.Unlock()
	if h == nil {
		return nil
	}
	return m.expired(h)
}

func (m *Manager) expired(h *held) error {
	if !m.clock.Now().Before(h.secret.NotAfter) {
		return fmt.Errorf("%w at %s", ErrExpired, h.secret.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

func certFields(s *Secret) []zap.Field {
	f := []zap.Field{
		zap.String(keyName, s.Name),
		zap.String(keyIdentity, s.Identity.String()),
		zap.Time(keyNotAfter, s.NotAfter),
		zap.String(keySource, s.Source),
		zap.Uint64(keyVersion, s.Version),
	}
	if s.Leaf != nil {
		f = append(f, zap.String(keySerial, s.Leaf.SerialNumber.Text(16)))
	}
	if !s.RenewAt.IsZero() {
		f = append(f, zap.Time(keyRenewAt, s.RenewAt))
	}
	return f
}

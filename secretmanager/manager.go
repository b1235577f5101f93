package secretmanager

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/pki"
)

// Defaults of Config.
const (
	DefaultTTL         = 24 * time.Hour
	DefaultGraceRatio  = 0.5
	DefaultGraceJitter = 0.01
	DefaultBackoffBase = 500 * time.Millisecond
	DefaultBackoffCap  = 60 * time.Second
	DefaultSignTimeout = time.Minute
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
)

// Provider serves the resource names under a prefix that the manager does not
// hold itself (file-cert:..., file-root:...). Its secrets carry the requested
// name.
type Provider interface {
	// Secret returns the current secret for name, waiting for it if needed
	// (bounded by ctx). Names it cannot serve give an error wrapping
	// ErrUnknownResource.
	Secret(ctx context.Context, name string) (*Secret, error)
	// Watch signals changes of name, like Manager.Watch.
	Watch(name string) (<-chan struct{}, func())
}

// Config describes a Manager. Zero values get the defaults noted.
type Config struct {
	// Identity is the workload identity requested from the CA. Required with CA.
	Identity pki.Identity
	// KeyType of the workload keys; a new key is made for every request.
	// Default pki.ECP256.
	KeyType pki.KeyType
	// CA signs the workload certificate. Nil means the workload certificate
	// comes only from Initial and Publish (file-mounted certificates).
	CA caclient.Client
	// Roots is the trust bundle: served as ROOTCA, and every CA answer must
	// chain to it. Required. A change is pushed to ROOTCA subscribers, and a
	// held certificate that no longer chains to it is renewed at once.
	Roots RootSource
	// TTL is the lifetime asked of the CA (SECRET_TTL). Default 24h.
	TTL time.Duration
	// GraceRatio (SECRET_GRACE_PERIOD_RATIO) is the share of life left at
	// renewal, in [0, 1]. Default 0.5; Linkerd uses 0.3.
	GraceRatio float64
	// GraceJitter (SECRET_GRACE_PERIOD_RATIO_JITTER), in [0, 1]. Default 0.01;
	// a negative value means no jitter.
	GraceJitter float64
	// MinRenewDelay and MaxRenewDelay clamp the time from arrival to renewal
	// (Linkerd: 10s and 24h). Zero means no clamp.
	MinRenewDelay, MaxRenewDelay time.Duration
	// BackoffBase is the first wait after a failed request; it doubles per
	// failure up to BackoffCap, with jitter. Defaults 500ms and 60s.
	BackoffBase, BackoffCap time.Duration
	// SignTimeout bounds one CA request (the CA client's own retries
	// included). Default 1m; negative means no bound.
	SignTimeout time.Duration
	// Clock times renewals, backoff and validity. Default the real clock.
	Clock clock.Clock
	// Rand returns a uniform number in [0, 1) for the jitters. Default
	// math/rand/v2.Float64. Calls are serialised by the manager.
	Rand func() float64
	// Initial seeds the workload certificate (OUTPUT_CERTS after a restart):
	// CertChain and PrivateKey PEM, Source. It is used only when it is valid
	// now, matches the key and, with a CA, is for Identity and chains to
	// Roots; otherwise it is logged and ignored. It is renewed on schedule as
	// if it had arrived at its NotBefore.
	Initial *Secret
	// Providers serve other resource names, keyed by name prefix (for example
	// FileCertPrefix); the longest matching prefix wins.
	Providers map[string]Provider
	// OnPublish, when set, is called with every secret the manager publishes
	// (the workload certificate and ROOTCA), in publication order, before SDS
	// subscribers are signalled; when Run starts it is called with the secrets
	// already held. It must not block for long nor modify the secret.
	OnPublish func(*Secret)
	// Source labels the workload certificates in Secret.Source and
	// /debug/certs. Default "ca", or "file" without a CA.
	Source string
	// Logger receives the manager's logs. Nil means no logs.
	Logger *zap.Logger
	// Registerer receives the metrics. Nil means they are not registered.
	Registerer prometheus.Registerer
}

// held is the workload certificate in service.
type held struct {
	secret *Secret
	chain  []*x509.Certificate
}

// Manager holds the workload certificate and the trust bundle, renews the
// certificate from the CA on the schedule of SPEC 8, and signals subscribers
// when a secret changes. Create it with New and start it with Run.
type Manager struct {
	cfg     Config
	policy  Policy
	log     *zap.Logger
	metrics *metrics
	clock   clock.Clock

	randMu sync.Mutex

	running atomic.Bool
	hub     hub

	// pubMu serialises publications so that OnPublish and the subscribers
	// see secrets in version order. Lock order: pubMu, then mu.
	pubMu sync.Mutex

	mu          sync.Mutex
	cert        *held
	roots       *Secret
	rootsBundle *Bundle
	version     uint64
	lastErr     error
}

// New checks cfg, fills in defaults and returns a Manager. It starts nothing.
func New(cfg Config) (*Manager, error) {
	if cfg.Roots == nil {
		return nil, errors.New("secret manager: no trust roots")
	}
	if cfg.CA != nil {
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
	if !(cfg.GraceRatio >= 0 && cfg.GraceRatio <= 1) {
		return nil, fmt.Errorf("secret manager: grace ratio %v is outside [0, 1]", cfg.GraceRatio)
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
		log:     cfg.Logger.Named("secretmanager"),
		metrics: met,
		clock:   cfg.Clock,
	}
	b := cfg.Roots.Bundle()
	if b == nil {
		return nil, errors.New("secret manager: root source has no bundle")
	}
	m.version++
	m.roots, m.rootsBundle = rootSecret(b, m.version), b
	if cfg.Initial != nil {
		h, err := m.checkPair(cfg.Initial.CertChain, cfg.Initial.PrivateKey, cfg.CA != nil)
		if err != nil {
			m.log.Warn("initial certificate ignored", zap.String(keySource, cfg.Initial.Source), zap.String(keyReason, pki.Reason(err)), zap.Error(err))
		} else {
			if cfg.Initial.Source != "" {
				h.secret.Source = cfg.Initial.Source
			}
			if cfg.CA != nil {
				h.secret.RenewAt = RenewAt(h.chain[0].NotBefore, h.secret.NotAfter, m.policy, m.rand())
			}
			m.version++
			h.secret.Version = m.version
			m.cert = h
			m.log.Info("initial certificate loaded", certFields(h.secret)...)
		}
	}
	return m, nil
}

func rootSecret(b *Bundle, version uint64) *Secret {
	return &Secret{Name: RootCertName, Roots: b.PEM, NotAfter: b.NotAfter, Source: b.Source, Version: version}
}

func (m *Manager) rand() float64 {
	m.randMu.Lock()
	defer m.randMu.Unlock()
	return m.cfg.Rand()
}

// Run keeps the workload certificate fresh and follows root changes until ctx
// ends (then it returns nil). Without a CA it only follows root changes. Only
// one Run may be active at a time.
func (m *Manager) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer m.running.Store(false)
	rootsCh, stopRoots := m.cfg.Roots.Watch()
	defer stopRoots()
	m.announce()
	var (
		failures int
		renewNow = m.refreshRoots() && !m.chainsToRoots()
	)
	for {
		wait := time.Duration(-1)
		if m.cfg.CA != nil {
			now := m.clock.Now()
			renewAt, holding := m.renewAt()
			if renewNow || !holding || !now.Before(renewAt) {
				err := m.renew(ctx)
				if ctx.Err() != nil {
					return nil
				}
				if err == nil {
					failures, renewNow = 0, false
					continue
				}
				wait = RetryDelay(failures, m.cfg.BackoffBase, m.cfg.BackoffCap, m.rand())
				failures++
				m.logFailure(err, failures, wait)
			} else {
				wait = renewAt.Sub(now)
			}
		}
		var (
			timer  clock.Timer
			timerC <-chan time.Time
		)
		if wait >= 0 {
			timer = m.clock.NewTimer(wait)
			timerC = timer.C()
		}
		select {
		case <-ctx.Done():
			stopTimer(timer)
			return nil
		case <-timerC:
		case <-rootsCh:
			stopTimer(timer)
			if m.refreshRoots() && !m.chainsToRoots() {
				m.log.Warn("workload certificate does not chain to the new roots; renewing")
				renewNow = true
			}
		}
	}
}

func stopTimer(t clock.Timer) {
	if t != nil {
		t.Stop()
	}
}

func (m *Manager) logFailure(err error, attempt int, retryIn time.Duration) {
	fields := []zap.Field{zap.Int(keyAttempt, attempt), zap.Duration(keyRetryIn, retryIn), zap.Error(err)}
	if errors.Is(err, ErrRejected) {
		m.log.Warn("CA answer rejected", append([]zap.Field{zap.String(keyReason, pki.Reason(err))}, fields...)...)
		return
	}
	m.log.Warn("certificate request failed", fields...)
}

// renewAt returns when the held certificate is due, and whether one is held.
func (m *Manager) renewAt() (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cert == nil {
		return time.Time{}, false
	}
	return m.cert.secret.RenewAt, true
}

// renew asks the CA for a certificate for a new key, checks the answer and
// publishes it.
func (m *Manager) renew(ctx context.Context) error {
	id := m.cfg.Identity
	key, err := pki.GenerateKey(m.cfg.KeyType)
	if err != nil {
		m.metrics.renewals.WithLabelValues(resultKeyError).Inc()
		return m.failed(fmt.Errorf("generating key: %w", err))
	}
	csr, err := pki.NewCSR(key, id)
	if err != nil {
		m.metrics.renewals.WithLabelValues(resultKeyError).Inc()
		return m.failed(err)
	}
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		m.metrics.renewals.WithLabelValues(resultKeyError).Inc()
		return m.failed(err)
	}
	sctx, cancel := ctx, context.CancelFunc(func() {})
	if m.cfg.SignTimeout > 0 {
		sctx, cancel = context.WithTimeout(ctx, m.cfg.SignTimeout)
	}
	start := time.Now()
	chain, err := m.cfg.CA.Sign(sctx, csr, id, m.cfg.TTL)
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	m.metrics.caLatency.Observe(time.Since(start).Seconds())
	if err != nil {
		m.metrics.renewals.WithLabelValues(resultCAError).Inc()
		return m.failed(fmt.Errorf("requesting certificate for %s: %w", id, err))
	}
	now := m.clock.Now()
	if err := pki.VerifyIssued(chain, key.Public(), id, m.cfg.Roots.Bundle().Pool, now); err != nil {
		m.metrics.renewals.WithLabelValues(resultRejected).Inc()
		m.metrics.rejected.WithLabelValues(pki.Reason(err)).Inc()
		return m.failed(fmt.Errorf("%w: %w", ErrRejected, err))
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
	m.metrics.renewals.WithLabelValues(resultSuccess).Inc()
	m.publish(s, &held{secret: s, chain: chain})
	m.log.Info("certificate issued", append(certFields(s), zap.Duration(keyLatency, time.Since(start)))...)
	return nil
}

func (m *Manager) failed(err error) error {
	m.mu.Lock()
	m.lastErr = err
	m.mu.Unlock()
	return err
}

// publish gives s the next version, makes it current and tells OnPublish and
// the subscribers. h is the parsed certificate for the workload secret.
func (m *Manager) publish(s *Secret, h *held) {
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	m.mu.Lock()
	m.version++
	s.Version = m.version
	switch s.Name {
	case WorkloadCertName:
		m.cert = h
		m.lastErr = nil
	case RootCertName:
		m.roots = s
	}
	m.mu.Unlock()
	m.observe(s)
	if m.cfg.OnPublish != nil {
		m.cfg.OnPublish(s)
	}
	m.hub.notify(s.Name)
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
	var held []*Secret
	if m.cert != nil {
		held = append(held, m.cert.secret)
	}
	held = append(held, m.roots)
	m.mu.Unlock()
	for _, s := range held {
		m.observe(s)
		if m.cfg.OnPublish != nil {
			m.cfg.OnPublish(s)
		}
	}
}

// refreshRoots publishes ROOTCA anew if the root source changed, and reports
// whether it did.
func (m *Manager) refreshRoots() bool {
	b := m.cfg.Roots.Bundle()
	m.mu.Lock()
	same := b == nil || b == m.rootsBundle || bytes.Equal(b.PEM, m.rootsBundle.PEM)
	if !same {
		m.rootsBundle = b
	}
	m.mu.Unlock()
	if same {
		return false
	}
	m.log.Info("trust roots changed", zap.Int(keyRoots, len(b.Certs)), zap.String(keySource, b.Source))
	m.publish(rootSecret(b, 0), nil)
	return true
}

// chainsToRoots reports whether the held certificate (if any) still verifies
// to the current roots. Certificates not issued by the CA are not judged.
func (m *Manager) chainsToRoots() bool {
	m.mu.Lock()
	h, b := m.cert, m.rootsBundle
	m.mu.Unlock()
	if h == nil || m.cfg.CA == nil {
		return true
	}
	err := pki.VerifyIssued(h.chain, h.chain[0].PublicKey, m.cfg.Identity, b.Pool, m.clock.Now())
	return !errors.Is(err, pki.ErrUntrustedChain)
}

// Secret returns the current secret for name. For the workload certificate it
// waits, bounded by ctx, while none is held or the held one has expired.
// Names nobody serves give an error wrapping ErrUnknownResource.
func (m *Manager) Secret(ctx context.Context, name string) (*Secret, error) {
	switch name {
	case WorkloadCertName:
		return m.waitCert(ctx)
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

func (m *Manager) waitCert(ctx context.Context) (*Secret, error) {
	ch, cancel := m.hub.watch(WorkloadCertName)
	defer cancel()
	for {
		m.mu.Lock()
		h, lastErr := m.cert, m.lastErr
		m.mu.Unlock()
		if h != nil && m.clock.Now().Before(h.secret.NotAfter) {
			return h.secret, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			if lastErr != nil {
				return nil, fmt.Errorf("waiting for the workload certificate (last error: %v): %w", lastErr, ctx.Err())
			}
			return nil, fmt.Errorf("waiting for the workload certificate: %w", ctx.Err())
		}
	}
}

// Watch returns a channel that receives a value whenever the secret under
// name is replaced, and a function that ends the subscription. The channel
// has a one-slot buffer and signals merge: after a signal, call Secret for the
// newest version. For a name nobody serves the channel is nil.
func (m *Manager) Watch(name string) (<-chan struct{}, func()) {
	switch name {
	case WorkloadCertName, RootCertName:
		return m.hub.watch(name)
	}
	if p := m.provider(name); p != nil {
		return p.Watch(name)
	}
	return nil, func() {}
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
// credentials or file-mounted certificates) the workload certificate. It is
// refused when a CA manages the certificate, and when the pair does not parse,
// the key does not match or the certificate is not valid now; the held
// certificate then stays. Publishing the same pair again does nothing.
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
	m.mu.Lock()
	cur := m.cert
	m.mu.Unlock()
	if cur != nil && bytes.Equal(cur.secret.CertChain, h.secret.CertChain) && bytes.Equal(cur.secret.PrivateKey, h.secret.PrivateKey) {
		return nil
	}
	m.publish(h.secret, h)
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

// Ready returns nil while a workload certificate that has not expired is
// held, else an error saying why (wrapping ErrNoCertificate or ErrExpired).
func (m *Manager) Ready() error {
	m.mu.Lock()
	h, lastErr := m.cert, m.lastErr
	m.mu.Unlock()
	if h == nil {
		if lastErr != nil {
			return fmt.Errorf("%w (last error: %v)", ErrNoCertificate, lastErr)
		}
		return ErrNoCertificate
	}
	return m.expired(h)
}

// Live returns an error once the held workload certificate has expired. It
// is nil while the first certificate is awaited.
func (m *Manager) Live() error {
	m.mu.Lock()
	h := m.cert
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

// CertInfo describes one held certificate for /debug/certs. Its fields are
// those of status.CertInfo, so one converts to the other.
type CertInfo struct {
	// ResourceName is the SDS resource name.
	ResourceName string `json:"resource_name"`
	// Identity is the workload identity, or a root's common name.
	Identity  string    `json:"identity"`
	Serial    string    `json:"serial"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	RenewAt   time.Time `json:"renew_at,omitzero"`
	Source    string    `json:"source"`
}

// Certs lists the held workload certificate (leaf) and every root of the
// trust bundle.
func (m *Manager) Certs() []CertInfo {
	m.mu.Lock()
	h, b := m.cert, m.rootsBundle
	m.mu.Unlock()
	var out []CertInfo
	if h != nil {
		leaf := h.chain[0]
		out = append(out, CertInfo{
			ResourceName: WorkloadCertName,
			Identity:     h.secret.Identity.String(),
			Serial:       leaf.SerialNumber.Text(16),
			NotBefore:    leaf.NotBefore.UTC(),
			NotAfter:     leaf.NotAfter.UTC(),
			RenewAt:      h.secret.RenewAt.UTC(),
			Source:       h.secret.Source,
		})
	}
	roots := make([]CertInfo, 0, len(b.Certs))
	for _, c := range b.Certs {
		roots = append(roots, CertInfo{
			ResourceName: RootCertName,
			Identity:     c.Subject.CommonName,
			Serial:       c.SerialNumber.Text(16),
			NotBefore:    c.NotBefore.UTC(),
			NotAfter:     c.NotAfter.UTC(),
			Source:       b.Source,
		})
	}
	sort.SliceStable(roots, func(i, j int) bool { return roots[i].NotAfter.Before(roots[j].NotAfter) })
	return append(out, roots...)
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

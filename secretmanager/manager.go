package secretmanager

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/internal/backoff"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/notify"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
)

// Defaults of the Config fields no setting configures.
const (
	DefaultSignTimeout = time.Minute
)

var (
	// ErrNoCertificate is wrapped by Ready while no workload certificate is held.
	ErrNoCertificate = errors.New("no workload certificate yet")
	// ErrExpired is wrapped by Ready and Live once the held certificate expired.
	ErrExpired = errors.New("workload certificate expired")
	// ErrRejected is wrapped, together with the pki error saying why, by
	// errors for a CA answer that failed the checks of pki.VerifyIssued.
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

// Config describes a Manager. The fields a setting configures (TTL,
// GraceRatio, GraceJitter, MaxConcurrentCSRs, IdleGrace) have no default
// here: internal/app passes the setting's value. Other zero values get the
// defaults noted.
type Config struct {
	// Identity is the agent's own workload identity: what "default" means
	// for a caller asked for with the zero Identity. It is
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
	// TTL is the lifetime asked of the CA; at least a second. Required.
	TTL time.Duration
	// GraceRatio is the share of life left at renewal, in (0, 1]. Required.
	// RenewalFloor bounds how soon after arrival a certificate is renewed,
	// whatever the ratio.
	GraceRatio float64
	// GraceJitter is the random part of GraceRatio, in [0, 1]; zero means
	// none.
	GraceJitter float64
	// MinRenewDelay and MaxRenewDelay clamp the time from arrival to renewal
	// (Linkerd: 10s and 24h). Zero means no clamp.
	MinRenewDelay, MaxRenewDelay time.Duration
	// BackoffBase is the first wait after a failed request of an identity; it
	// doubles per failure of that identity up to BackoffCap, with jitter.
	// Zero means backoff.Default's.
	BackoffBase, BackoffCap time.Duration
	// SignTimeout bounds one CA request. Default 1m; negative means no bound.
	SignTimeout time.Duration
	// CSRSigner signs the CSRJobs of SignCSR (CSRs of keys the agent does
	// not hold). Nil means SignCSR refuses.
	CSRSigner Signer
	// MaxConcurrentCSRs bounds the CA requests in flight across identities
	// and CSRJobs; at least 1. Required.
	MaxConcurrentCSRs int
	// IdleGrace is how long an identity with no subscriber, no waiting
	// caller and no Prefetch is kept before it is dropped; at least a
	// second. Required.
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

// Manager holds the workload certificates of any number of identities and
// the trust bundle, renews each certificate from the CA on the schedule of
// docs/operations.md, and signals subscribers when a secret changes. Create it with New
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

	mu       sync.Mutex
	entries  map[pki.Identity]*entry
	own      *entry       // nil when no own identity is configured
	timers   heap[timed]  // entries by due time
	ready    heap[ranked] // due entries waiting for a CSR slot, best first
	idle     heap[timed]  // unused entries by the time they may be dropped
	inFlight int
	jobWaits map[pki.Identity]jobWait // backoff of CSRJobs by identity
	version  uint64
	roots    *Secret // ROOTCA; its Bundle verifies every CA answer
	rootSubs notify.Set
}

// New checks cfg, fills in defaults and returns a Manager. It starts nothing.
func New(cfg Config) (*Manager, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
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
		jobWaits: make(map[pki.Identity]jobWait),
		timers:   heap[timed]{less: timedLess},
		ready:    heap[ranked]{less: rankedLess},
		idle:     heap[timed]{less: timedLess},
		rootSubs: notify.Set{},
	}
	b, source := cfg.Roots.Bundle()
	if b == nil {
		return nil, errors.New("secret manager: root source has no bundle")
	}
	m.version++
	m.roots = secret.RootSecret(RootCertName, b, source)
	m.roots.CRL = cfg.Roots.CRL()
	m.roots.Version = m.version
	if !cfg.Identity.IsZero() || cfg.CA == nil {
		// Without a CA the own entry holds whatever Publish brings, whose
		// identity is read from the certificate.
		m.own = m.addLocked(&entry{id: cfg.Identity, own: true, subs: notify.Set{}}, m.clock.Now())
	}
	if cfg.Initial != nil && m.own != nil {
		m.loadInitial(cfg.Initial)
	}
	return m, nil
}

// withDefaults checks cfg and returns it with its zero values replaced by
// the defaults.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Roots == nil {
		return cfg, errors.New("secret manager: no trust roots")
	}
	if !cfg.Identity.IsZero() {
		if err := cfg.Identity.Validate(); err != nil {
			return cfg, fmt.Errorf("secret manager: workload identity: %w", err)
		}
	}
	if cfg.TTL < time.Second {
		return cfg, fmt.Errorf("secret manager: Config.TTL %s is shorter than a second", cfg.TTL)
	}
	if !(cfg.GraceRatio > 0 && cfg.GraceRatio <= 1) {
		return cfg, fmt.Errorf("secret manager: Config.GraceRatio %v is outside (0, 1]", cfg.GraceRatio)
	}
	if !(cfg.GraceJitter >= 0 && cfg.GraceJitter <= 1) {
		return cfg, fmt.Errorf("secret manager: Config.GraceJitter %v is outside [0, 1]", cfg.GraceJitter)
	}
	if cfg.MinRenewDelay < 0 || cfg.MaxRenewDelay < 0 || (cfg.MaxRenewDelay > 0 && cfg.MaxRenewDelay < cfg.MinRenewDelay) {
		return cfg, fmt.Errorf("secret manager: renewal delay clamp [%s, %s] is not a range", cfg.MinRenewDelay, cfg.MaxRenewDelay)
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = backoff.Default.Base
	}
	if cfg.BackoffCap <= 0 {
		cfg.BackoffCap = backoff.Default.Cap
	}
	cfg.BackoffCap = max(cfg.BackoffCap, cfg.BackoffBase)
	switch {
	case cfg.SignTimeout == 0:
		cfg.SignTimeout = DefaultSignTimeout
	case cfg.SignTimeout < 0:
		cfg.SignTimeout = 0
	}
	if cfg.MaxConcurrentCSRs < 1 {
		return cfg, fmt.Errorf("secret manager: Config.MaxConcurrentCSRs %d is not positive", cfg.MaxConcurrentCSRs)
	}
	if cfg.IdleGrace < time.Second {
		return cfg, fmt.Errorf("secret manager: Config.IdleGrace %s is shorter than a second", cfg.IdleGrace)
	}
	for prefix, p := range cfg.Providers {
		if prefix == "" || p == nil {
			return cfg, fmt.Errorf("secret manager: provider for prefix %q: empty prefix or nil provider", prefix)
		}
		if prefix == WorkloadCertName || prefix == RootCertName {
			return cfg, fmt.Errorf("secret manager: provider prefix %q shadows a built-in resource", prefix)
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
	return cfg, nil
}

func (m *Manager) loadInitial(in *Secret) {
	h, err := m.checkPair(in.CertChain, in.PrivateKey, m.cfg.CA != nil)
	if err != nil {
		m.log.Warn("initial certificate ignored", zap.String(logkeys.Source, in.Source), zap.String(logkeys.Reason, pki.Reason(err)), zap.Error(err))
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

func (m *Manager) rand() float64 {
	m.randMu.Lock()
	defer m.randMu.Unlock()
	return m.cfg.Rand()
}

package secretmanager

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/internal/pki"
)

// Signer signs a CSR for an identity and returns the chain, leaf first,
// unjudged (caclient.Client's Sign).
type Signer interface {
	Sign(ctx context.Context, csr []byte, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error)
}

// CSRJob is a one-shot signing of a CSR whose key the agent does not hold
// (a PodCertificateRequest's: the kubelet's key). Nothing of it is cached.
type CSRJob struct {
	// CSR is sent to the CA as is (DER).
	CSR []byte
	// PublicKey is the CSR's key: the answer must certify it.
	PublicKey crypto.PublicKey
	Identity  pki.Identity
	// TTL is the life asked of the CA.
	TTL time.Duration
	// OnStart, when set, is called once the job holds a CSR slot, before
	// the CA is asked.
	OnStart func()
}

// Signed is the CA's checked answer to a CSRJob.
type Signed struct {
	Chain   []*x509.Certificate
	Latency time.Duration // of the CA request alone
}

var (
	// ErrNoCSRSigner is returned by SignCSR without Config.CSRSigner.
	ErrNoCSRSigner = errors.New("no CA signs CSRs of other keys")
	// ErrBackingOff is wrapped by the BackoffError of a job refused before
	// the CA was asked: its identity waits after a failure.
	ErrBackingOff = errors.New("identity backing off after a failed request")
)

// BackoffError is SignCSR's error when the CA could not answer, its answer
// failed the checks (Err wraps ErrRejected), or the identity is still
// backing off (Err is ErrBackingOff): no job of the identity should be
// sent before RetryIn.
type BackoffError struct {
	RetryIn time.Duration
	Err     error
}

func (e *BackoffError) Error() string {
	return fmt.Sprintf("%v (retry in %s)", e.Err, e.RetryIn)
}

func (e *BackoffError) Unwrap() error { return e.Err }

// job is a CSRJob waiting for or holding a CSR slot. Guarded by mu.
type job struct {
	id        pki.Identity
	start     chan struct{} // closed when the scheduler gives it a slot
	started   bool
	cancelled bool // its caller left before it started
}

// jobWait is an identity's backoff after failed jobs.
type jobWait struct {
	failures int
	until    time.Time
}

// SignCSR signs job through the scheduler: it waits (bounded by ctx) for a
// CSR slot of the one MaxConcurrentCSRs budget, ranked as a caller blocked
// on its certificate, asks Config.CSRSigner (within SignTimeout) and checks
// the answer as any CA answer (pki.VerifyIssued with the job's key and
// identity and the roots in force). A failed job backs its identity's jobs
// off (BackoffError), apart from a CA refusal for good
// (caclient.Permanent), which is returned as is. A job needs Run.
func (m *Manager) SignCSR(ctx context.Context, in CSRJob) (Signed, error) {
	if m.cfg.CSRSigner == nil {
		return Signed{}, ErrNoCSRSigner
	}
	if err := in.Identity.Validate(); err != nil {
		return Signed{}, fmt.Errorf("signing a CSR: %w", err)
	}
	j := &job{id: in.Identity, start: make(chan struct{})}
	m.mu.Lock()
	if wait := m.jobWaitLocked(in.Identity); wait > 0 {
		m.mu.Unlock()
		return Signed{}, &BackoffError{RetryIn: wait, Err: ErrBackingOff}
	}
	m.ready.push(ranked{j: j, prio: prioWaiting, due: m.clock.Now()})
	m.mu.Unlock()
	m.poke()

	select {
	case <-j.start:
	case <-ctx.Done():
		m.mu.Lock()
		started := j.started
		j.cancelled = true
		if started {
			m.doneJobLocked()
		}
		m.mu.Unlock()
		if started {
			m.poke()
		}
		return Signed{}, ctx.Err()
	}
	defer func() {
		m.mu.Lock()
		m.doneJobLocked()
		m.mu.Unlock()
		m.poke()
	}()
	if in.OnStart != nil {
		in.OnStart()
	}
	sctx, cancel := ctx, context.CancelFunc(func() {})
	if m.cfg.SignTimeout > 0 {
		sctx, cancel = context.WithTimeout(ctx, m.cfg.SignTimeout)
	}
	start := time.Now()
	chain, err := m.cfg.CSRSigner.Sign(sctx, in.CSR, in.Identity, in.TTL)
	cancel()
	out := Signed{Latency: time.Since(start)}
	switch {
	case ctx.Err() != nil:
		return out, ctx.Err()
	case err != nil && caclient.Permanent(err):
		return out, fmt.Errorf("requesting certificate for %s: %w", in.Identity, err)
	case err != nil:
		return out, m.jobFailed(in.Identity, fmt.Errorf("requesting certificate for %s: %w", in.Identity, err))
	}
	if err := pki.VerifyIssued(chain, in.PublicKey, in.Identity, m.sourcePool(), m.clock.Now()); err != nil {
		m.metrics.rejected.WithLabelValues(pki.Reason(err)).Inc()
		return out, m.jobFailed(in.Identity, fmt.Errorf("%w: %w", ErrRejected, err))
	}
	m.mu.Lock()
	delete(m.jobWaits, in.Identity)
	m.mu.Unlock()
	out.Chain = chain
	return out, nil
}

// doneJobLocked gives back a job's slot. Called with mu held.
func (m *Manager) doneJobLocked() {
	m.inFlight--
	m.metrics.inFlight.Set(float64(m.inFlight))
}

// jobFailed backs id's jobs off after a failure and returns the
// BackoffError saying for how long.
func (m *Manager) jobFailed(id pki.Identity, err error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.jobWaits[id]
	wait := m.backoff.Delay(w.failures, m.rand())
	w.failures++
	w.until = m.clock.Now().Add(wait)
	m.jobWaits[id] = w
	return &BackoffError{RetryIn: wait, Err: err}
}

// jobWaitLocked returns how long id's jobs still back off. An identity
// quiet for longer than BackoffCap after its wait is forgotten: its next
// failure starts afresh, and identities that left are not kept. Called
// with mu held.
func (m *Manager) jobWaitLocked(id pki.Identity) time.Duration {
	w, ok := m.jobWaits[id]
	if !ok {
		return 0
	}
	now := m.clock.Now()
	if now.After(w.until.Add(m.cfg.BackoffCap)) {
		delete(m.jobWaits, id)
		return 0
	}
	return w.until.Sub(now)
}

package secretmanager

import (
	"context"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"github.com/meshagent/meshagent/internal/notify"
	"github.com/meshagent/meshagent/internal/pki"
)

// held is a workload certificate in service. It is never modified.
type held struct {
	secret *Secret
	chain  []*x509.Certificate
}

// entry is the state of one identity. It is guarded by Manager.mu.
type entry struct {
	id  pki.Identity
	own bool // the configured identity: never dropped, handed to OnPublish

	cert     *held     // the certificate in service; nil before the first
	lastErr  error     // of the last request, nil after a success
	inFlight bool      // a CSR for it is out
	due      time.Time // when the next request may start (zero: now)
	failures int       // consecutive failed requests: its own backoff

	// tickets are its places in the scheduler's queues (see stamp).
	tickets [numQueues]uint64

	subs    notify.Set // Watch subscribers and waiting callers
	waiters int        // callers blocked in Secret
	pins    int        // Prefetch holds
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

// entryLocked returns the entry of id, making it if needed. Called with mu
// held (or before the manager is shared).
func (m *Manager) entryLocked(id pki.Identity, now time.Time) *entry {
	if e := m.entries[id]; e != nil {
		return e
	}
	return m.addLocked(&entry{id: id, subs: notify.Set{}}, now)
}

// addLocked holds e from now on: queued for its first certificate and, as
// long as nobody uses it, for being dropped. Called with mu held (or before
// the manager is shared).
func (m *Manager) addLocked(e *entry, now time.Time) *entry {
	m.entries[e.id] = e
	m.metrics.identities.Set(float64(len(m.entries)))
	m.enqueueLocked(e)
	m.released(e, now)
	return e
}

// acquired records that someone took hold of e (a subscriber, a waiting
// caller, a Prefetch); wasUsed says whether e was in use before. Called with
// mu held, after the hold was counted. An entry used again is queued anew
// (the queues forget unused entries); one without a valid certificate too,
// since its rank may have risen. A renewal already queued stays as it is.
func (m *Manager) acquired(e *entry, wasUsed bool) {
	if !wasUsed {
		e.stamp(idleQueue) // no longer idle: its drop is called off
	}
	if !e.inFlight && (!wasUsed || e.valid(m.clock.Now()) == nil) {
		m.enqueueLocked(e)
		m.poke()
	}
}

// released records that someone let go of e. Called with mu held.
func (m *Manager) released(e *entry, now time.Time) {
	if !e.used() {
		m.idle.push(timed{e: e, ticket: e.stamp(idleQueue), at: now.Add(m.cfg.IdleGrace)})
		m.poke() // the sweep needs a timer for it
	}
}

// currentCert returns the valid certificate of id, never waiting. Without
// one it returns an error wrapping ErrNoCertificate or ErrExpired, and the
// last request's error if there was one. A new identity is held from now on
// (and its first certificate requested) until the idle grace period ends.
func (m *Manager) currentCert(id pki.Identity) (*Secret, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	e := m.entryLocked(id, now)
	if s := e.valid(now); s != nil {
		return s, nil
	}
	err := fmt.Errorf("%w for %s", ErrNoCertificate, id)
	if e.cert != nil {
		err = fmt.Errorf("%w for %s at %s", ErrExpired, id, e.cert.secret.NotAfter.UTC().Format(time.RFC3339))
	}
	if e.lastErr != nil {
		return nil, fmt.Errorf("%w (last error: %w)", err, e.lastErr)
	}
	return nil, err
}

// waitCert returns the valid certificate of id, waiting (bounded by ctx)
// while none is held.
func (m *Manager) waitCert(ctx context.Context, id pki.Identity) (*Secret, error) {
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
	was := e.used()
	ch := e.subs.Add()
	e.waiters++
	m.acquired(e, was)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		e.subs.Remove(ch)
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

// watchCert subscribes to the certificates of id and holds it until the
// returned function is called.
func (m *Manager) watchCert(id pki.Identity) (<-chan struct{}, func()) {
	m.mu.Lock()
	e := m.entryLocked(id, m.clock.Now())
	was := e.used()
	ch := e.subs.Add()
	m.acquired(e, was)
	m.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			m.mu.Lock()
			e.subs.Remove(ch)
			m.released(e, m.clock.Now())
			m.mu.Unlock()
		})
	}
}

func waitError(id pki.Identity, ctxErr, lastErr error) error {
	if lastErr != nil {
		return fmt.Errorf("waiting for the certificate of %s: %w (last error: %w)", id, ctxErr, lastErr)
	}
	return fmt.Errorf("waiting for the certificate of %s: %w", id, ctxErr)
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

package secretmanager

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

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

// notify signals every subscriber of e without blocking. Called with mu held.
func (e *entry) notify() {
	for ch := range e.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
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

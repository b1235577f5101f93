package secretmanager

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/notify"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
)

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

// poke asks Run to look at the entries again. It never blocks.
func (m *Manager) poke() { notify.Signal(m.wake) }

// enqueueLocked (re)queues e at its due time; items queued for it before
// are stale from now on. Called with mu held whenever e's due time or its
// claim on a slot changes: made, used again, finished, roots changed.
func (m *Manager) enqueueLocked(e *entry) {
	if m.cfg.CA == nil {
		return // nothing is ever requested
	}
	m.timers.push(timed{e: e, ticket: e.stamp(dueQueue), at: e.due})
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
	dropped, next, ok := m.sweepLocked(now)
	if m.cfg.CA != nil || m.cfg.CSRSigner != nil {
		next, ok = m.startDueLocked(ctx, wg, now, next, ok)
	}
	m.mu.Unlock()
	for _, id := range dropped {
		m.log.Debug("identity dropped: unused", zap.String(logkeys.Identity, id.String()))
	}
	return next, ok
}

// sweepLocked drops the entries unused for the grace period and returns
// their identities and when the next one may be dropped. Called with mu
// held.
func (m *Manager) sweepLocked(now time.Time) (dropped []pki.Identity, next time.Time, ok bool) {
	for m.idle.len() > 0 {
		it := m.idle.peek()
		e := it.e
		if e.stale(idleQueue, it.ticket) {
			m.idle.pop()
			continue
		}
		if it.at.After(now) {
			next, ok = it.at, true
			break
		}
		m.idle.pop()
		delete(m.entries, e.id)
		e.stamp(dueQueue) // whatever it still holds in the queues is stale
		e.stamp(idleQueue)
		m.metrics.dropped.Inc()
		dropped = append(dropped, e.id)
	}
	m.metrics.identities.Set(float64(len(m.entries)))
	return dropped, next, ok
}

// startDueLocked moves the entries that fell due to the ready queue and
// starts the best of them while slots are free; the rest wait for a slot
// (every finished request wakes Run). It returns the earlier of (next, ok)
// and the next due time. Called with mu held.
func (m *Manager) startDueLocked(ctx context.Context, wg *sync.WaitGroup, now, next time.Time, ok bool) (time.Time, bool) {
	for m.timers.len() > 0 {
		it := m.timers.peek()
		if it.e.stale(dueQueue, it.ticket) || !m.startable(it.e) {
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
		m.ready.push(ranked{e: it.e, ticket: it.ticket, prio: it.e.priority(now), due: it.e.due})
	}
	for m.inFlight < m.cfg.MaxConcurrentCSRs && m.ready.len() > 0 {
		it := m.ready.pop()
		if j := it.j; j != nil {
			if !j.cancelled {
				j.started = true
				m.inFlight++
				close(j.start)
			}
			continue
		}
		e := it.e
		if e.stale(dueQueue, it.ticket) || !m.startable(e) {
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
		m.doneLocked(e)
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
	if err := pki.VerifyIssued(chain, key.Public(), id, m.sourcePool(), now); err != nil {
		m.metrics.renewals.WithLabelValues(resultRejected).Inc()
		m.metrics.rejected.WithLabelValues(pki.Reason(err)).Inc()
		return nil, nil, fmt.Errorf("%w: %w", ErrRejected, err)
	}
	s := secret.CertSecret(WorkloadCertName, chain, keyPEM, m.cfg.Source)
	s.Identity = id
	s.RenewAt = RenewAt(now, s.NotAfter, m.policy, m.rand())
	m.log.Debug("CA answered", zap.String(logkeys.Identity, id.String()), zap.Duration(logkeys.Latency, latency))
	return s, &held{secret: s, chain: chain}, nil
}

// doneLocked records that the request for e ended. Called with mu held.
func (m *Manager) doneLocked(e *entry) {
	e.inFlight = false
	m.inFlight--
}

// finish records the result of a request for e: a new certificate is
// published, a failure sets the identity's next attempt by its backoff. A
// result for an entry dropped meanwhile is discarded.
func (m *Manager) finish(e *entry, s *Secret, h *held, err error) {
	if err != nil {
		m.fail(e, err)
		return
	}
	pub := m.publish(func() (*Secret, notify.Set, bool) {
		m.doneLocked(e)
		if m.entries[e.id] != e {
			return nil, nil, false
		}
		e.cert, e.lastErr, e.failures, e.due = h, nil, 0, s.RenewAt
		m.enqueueLocked(e)
		return s, e.subs, e.own
	})
	if pub == nil {
		m.metrics.renewals.WithLabelValues(resultDiscarded).Inc()
		m.log.Debug("CA answer discarded: identity dropped meanwhile", zap.String(logkeys.Identity, e.id.String()))
		return
	}
	m.metrics.renewals.WithLabelValues(resultSuccess).Inc()
	m.log.Info("certificate issued", certFields(pub)...)
}

// fail records a failed request for e: its next attempt waits for its own
// backoff.
func (m *Manager) fail(e *entry, err error) {
	m.mu.Lock()
	m.doneLocked(e)
	if m.entries[e.id] != e {
		m.mu.Unlock()
		m.log.Debug("CA answer discarded: identity dropped meanwhile", zap.String(logkeys.Identity, e.id.String()))
		return
	}
	e.lastErr = err
	wait := m.backoff.Delay(e.failures, m.rand())
	e.failures++
	e.due = m.clock.Now().Add(wait)
	m.enqueueLocked(e)
	attempt := e.failures
	m.mu.Unlock()
	m.logFailure(e.id, err, attempt, wait)
}

func (m *Manager) logFailure(id pki.Identity, err error, attempt int, retryIn time.Duration) {
	fields := []zap.Field{zap.String(logkeys.Identity, id.String()), zap.Int(logkeys.Attempt, attempt), zap.Duration(logkeys.RetryIn, retryIn), zap.Error(err)}
	if errors.Is(err, ErrRejected) {
		m.log.Warn("CA answer rejected", append([]zap.Field{zap.String(logkeys.Reason, pki.Reason(err))}, fields...)...)
		return
	}
	m.log.Warn("certificate request failed", fields...)
}

// sourcePool returns the pool of the root source's bundle in force now:
// every CA answer must chain to it.
func (m *Manager) sourcePool() *x509.CertPool {
	b, _ := m.cfg.Roots.Bundle()
	return b.Pool()
}

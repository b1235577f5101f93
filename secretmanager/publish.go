package secretmanager

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/notify"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
)

// publish is the one way a secret becomes visible. Under pubMu (so every
// publication is seen in version order) and mu, install checks the change
// and makes it: it returns the new secret (nil: nothing to publish), the
// subscribers to signal and whether OnPublish gets the secret. publish then
// stamps the next version on the secret, releases mu, hands the secret over
// and signals the subscribers, and returns it.
func (m *Manager) publish(install func() (s *Secret, subs notify.Set, handOver bool)) *Secret {
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	m.mu.Lock()
	s, subs, handOver := install()
	if s == nil {
		m.mu.Unlock()
		return nil
	}
	m.version++
	s.Version = m.version
	m.mu.Unlock()
	if handOver {
		m.handOver(s)
	}
	m.mu.Lock()
	subs.Signal()
	m.mu.Unlock()
	return s
}

// handOver records s in the metrics and gives it to OnPublish. Called with
// pubMu held.
func (m *Manager) handOver(s *Secret) {
	m.metrics.expiry.WithLabelValues(s.Name).Set(float64(s.NotAfter.Unix()))
	if !s.RenewAt.IsZero() {
		m.metrics.renewAt.WithLabelValues(s.Name).Set(float64(s.RenewAt.Unix()))
	}
	if m.cfg.OnPublish != nil {
		m.cfg.OnPublish(s)
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
		m.handOver(s)
	}
}

// refreshRoots publishes ROOTCA anew if the root source changed, and reports
// whether it did. It touches no certificate.
func (m *Manager) refreshRoots() bool {
	b, source := m.cfg.Roots.Bundle()
	crl := m.cfg.Roots.CRL()
	pub := m.publish(func() (*Secret, notify.Set, bool) {
		if b == nil || (b.Equal(m.roots.Bundle) && bytes.Equal(crl, m.roots.CRL)) {
			return nil, nil, false
		}
		m.roots = secret.RootSecret(RootCertName, b, source)
		m.roots.CRL = crl
		return m.roots, m.rootSubs, true
	})
	if pub == nil {
		return false
	}
	m.log.Info("trust roots changed", zap.Int(logkeys.Roots, len(b.Certs())), zap.String(logkeys.Source, source))
	return true
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
	pool := m.roots.Bundle.Pool()
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
	var renewing []pki.Identity
	m.mu.Lock()
	for _, c := range stale {
		if c.e.cert == c.h && m.entries[c.e.id] == c.e {
			c.e.due, c.e.failures = time.Time{}, 0
			if !c.e.inFlight {
				m.enqueueLocked(c.e)
			}
			renewing = append(renewing, c.e.id)
		}
	}
	m.mu.Unlock()
	m.poke()
	for _, id := range renewing {
		m.log.Warn("certificate does not chain to the new roots; renewing", zap.String(logkeys.Identity, id.String()))
	}
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
		m.log.Warn("certificate not published", zap.String(logkeys.Source, s.Source), zap.String(logkeys.Reason, pki.Reason(err)), zap.Error(err))
		return err
	}
	if s.Source != "" {
		h.secret.Source = s.Source
	}
	pub := m.publish(func() (*Secret, notify.Set, bool) {
		e := m.own
		if cur := e.cert; cur != nil && bytes.Equal(cur.secret.CertChain, h.secret.CertChain) && bytes.Equal(cur.secret.PrivateKey, h.secret.PrivateKey) {
			return nil, nil, false
		}
		e.cert, e.lastErr = h, nil
		return h.secret, e.subs, true
	})
	if pub == nil {
		return nil
	}
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
		if err := pki.VerifyIssued(chain, key.Public(), id, m.sourcePool(), now); err != nil {
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
	s := secret.CertSecret(WorkloadCertName, chain, normKey, m.cfg.Source)
	s.Identity = id
	return &held{secret: s, chain: chain}, nil
}

func certFields(s *Secret) []zap.Field {
	f := []zap.Field{
		zap.String(logkeys.Name, s.Name),
		zap.String(logkeys.Identity, s.Identity.String()),
		zap.Time(logkeys.NotAfter, s.NotAfter),
		zap.String(logkeys.Source, s.Source),
		zap.Uint64(logkeys.Version, s.Version),
	}
	if s.Leaf != nil {
		f = append(f, zap.String(logkeys.Serial, s.Leaf.SerialNumber.Text(16)))
	}
	if !s.RenewAt.IsZero() {
		f = append(f, zap.Time(logkeys.RenewAt, s.RenewAt))
	}
	return f
}

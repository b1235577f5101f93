package secretmanager

import (
	"fmt"
	"time"
)

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

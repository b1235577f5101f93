package secretmanager

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/meshagent/meshagent/internal/pki"
)

// identityFor returns the identity "default" means for a caller the edge
// (sds, workloadapi) resolved to id: id when set, else the configured
// identity. The manager never looks at the transport: whoever serves a
// caller resolves it and passes the identity in.
func (m *Manager) identityFor(id pki.Identity) (pki.Identity, error) {
	if !id.IsZero() {
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
// certificate of id, the caller's identity as the edge resolved it (the
// zero Identity: the configured one; see identityFor); Secret waits,
// bounded by ctx, while none is held for it or the held one has expired.
// Names nobody serves give an error wrapping ErrUnknownResource. To read
// without waiting, use Current.
func (m *Manager) Secret(ctx context.Context, id pki.Identity, name string) (*Secret, error) {
	switch name {
	case WorkloadCertName:
		id, err := m.identityFor(id)
		if err != nil {
			return nil, err
		}
		return m.waitCert(ctx, id)
	case RootCertName:
		return m.currentRoots(), nil
	}
	if p := m.provider(name); p != nil {
		return p.Secret(ctx, name)
	}
	return nil, unknown(name)
}

// Current returns the secret held now for name and never waits: without
// one (no certificate yet for the caller's identity, or it expired; a file
// not loaded yet) it returns an error saying why (wrapping ErrNoCertificate
// or ErrExpired for "default"); id is the caller's identity, as in Secret.
// Asking for an identity not held yet
// holds it for the idle grace period and requests its certificate. Errors
// that mean the name can never be served wrap ErrUnknownResource or
// ErrNoIdentity, as Secret's.
func (m *Manager) Current(id pki.Identity, name string) (*Secret, error) {
	switch name {
	case WorkloadCertName:
		id, err := m.identityFor(id)
		if err != nil {
			return nil, err
		}
		return m.currentCert(id)
	case RootCertName:
		return m.currentRoots(), nil
	}
	if p := m.provider(name); p != nil {
		return p.Current(name)
	}
	return nil, unknown(name)
}

func unknown(name string) error { return fmt.Errorf("%w: %.200q", ErrUnknownResource, name) }

func (m *Manager) currentRoots() *Secret {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.roots
}

// Watch returns a channel that receives a value whenever the secret under
// name (for "default": the certificate of id, as in Secret) is replaced, and
// a function that ends the subscription. The channel has a one-slot buffer
// and signals merge: after a signal, call Secret for the newest version.
// Watching "default" holds the identity: it is kept fresh, and dropped only
// once nobody watches or waits for it. For a name nobody serves, a caller
// with no identity, or a provider's name it refused to hold, the channel is
// nil (Secret says why, unless a provider's limit freed up meanwhile): the
// name must then be refused, never served unwatched.
func (m *Manager) Watch(id pki.Identity, name string) (<-chan struct{}, func()) {
	switch name {
	case WorkloadCertName:
		id, err := m.identityFor(id)
		if err != nil {
			return nil, func() {}
		}
		return m.watchCert(id)
	case RootCertName:
		m.mu.Lock()
		ch := m.rootSubs.Add()
		m.mu.Unlock()
		var once sync.Once
		return ch, func() {
			once.Do(func() {
				m.mu.Lock()
				m.rootSubs.Remove(ch)
				m.mu.Unlock()
			})
		}
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

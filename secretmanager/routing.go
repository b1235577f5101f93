package secretmanager

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/caller"
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

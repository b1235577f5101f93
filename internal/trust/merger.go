package trust

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
)

// Publisher receives every new merged bundle (one or more certificates,
// parsed already) with a description of where it came from.
// *secretmanager.Roots is one: the bundle the agent serves as ROOTCA and
// verifies the CA and the control plane with.
type Publisher interface {
	SetBundle(b *pki.Bundle, source string)
}

// Sink is what a source reports to: the merger. Update replaces everything
// the named source contributed; an error means the update was refused and
// the source's last good roots stay. Refuse records that the source has
// nothing usable now (deleted, missing key); its last good roots stay.
type Sink interface {
	Update(source string, pemData []byte) error
	Refuse(source string, err error)
}

// MergerConfig configures a Merger.
type MergerConfig struct {
	// Publisher receives each new merged bundle. Required.
	Publisher Publisher
	// Logger is narrowed with .Named("trust"). Nil means zap.NewNop().
	Logger *zap.Logger
	// Metrics counts updates and refusals; nil means they are not counted.
	Metrics *Metrics
}

// Merger holds the last good roots of every source and publishes their
// union, de-duplicated, whenever it changes. Sources are merged in the order
// they first reported, each in its own order; a certificate that several
// sources hold appears once, where it was first seen. Safe for concurrent
// use.
type Merger struct {
	pub     Publisher
	log     *zap.Logger
	metrics *Metrics

	mu      sync.Mutex // guards the fields below and serialises publications
	order   []string
	parts   map[string][]*x509.Certificate
	current *pki.Bundle // the bundle last published
}

// NewMerger returns a merger that publishes to cfg.Publisher. It starts
// nothing.
func NewMerger(cfg MergerConfig) (*Merger, error) {
	if cfg.Publisher == nil {
		return nil, errors.New("trust: merger has no publisher")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Merger{
		pub:     cfg.Publisher,
		log:     cfg.Logger.Named("trust"),
		metrics: cfg.Metrics,
		parts:   map[string][]*x509.Certificate{},
	}, nil
}

// Update replaces the roots of source with the certificates of pemData. A
// bundle that does not parse (see pki.ParseCertificates: anything but
// CERTIFICATE blocks is an error) or holds none is refused: logged, counted
// and returned, and source's last good roots stay in the merge. An update
// that changes the union publishes it.
func (m *Merger) Update(source string, pemData []byte) error {
	certs, err := pki.ParseCertificates(pemData)
	if err != nil {
		m.Refuse(source, err)
		return fmt.Errorf("trust source %s: %w", source, err)
	}
	m.update(source, certs)
	return nil
}

// UpdateBundle replaces the roots of source with those of b, a bundle
// parsed already (the root files'). A nil or empty bundle is refused as
// Update refuses one.
func (m *Merger) UpdateBundle(source string, b *pki.Bundle) error {
	if len(b.Certs()) == 0 {
		err := errors.New("no certificates")
		m.Refuse(source, err)
		return fmt.Errorf("trust source %s: %w", source, err)
	}
	m.update(source, b.Certs())
	return nil
}

// Withdraw records that source now holds no roots by its own say (istiod's
// ProxyConfig with no extra roots): unlike a refusal, its roots leave the
// merge.
func (m *Merger) Withdraw(source string) {
	m.update(source, nil)
}

// update makes certs the roots of source and publishes the union if it
// changed.
func (m *Merger) update(source string, certs []*x509.Certificate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, known := m.parts[source]; !known {
		m.order = append(m.order, source)
	}
	m.parts[source] = certs
	merged, sources := m.merge()
	if merged.Equal(m.current) {
		return
	}
	m.pub.SetBundle(merged, strings.Join(sources, "+"))
	m.current = merged
	n := len(merged.Certs())
	m.metrics.updated(source, n)
	m.log.Info("trust bundle changed", zap.String(logkeys.Source, source), zap.Strings(logkeys.Sources, sources), zap.Int(logkeys.Roots, n))
}

// Refuse records that source gave something unusable (logged with the
// reason, counted); its last good roots stay.
func (m *Merger) Refuse(source string, err error) {
	reason := Reason(err)
	m.metrics.refused(source, reason)
	m.log.Warn("trust source refused, keeping its last good roots", zap.String(logkeys.Source, source), zap.String(logkeys.Reason, reason), zap.Error(err))
}

// Bundle returns the merged bundle last published (nil before the first).
func (m *Merger) Bundle() *pki.Bundle {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.current
}

// merge is the union of every source's roots, in source order, each
// certificate once, with the sources that hold at least one. m.mu is held.
func (m *Merger) merge() (*pki.Bundle, []string) {
	var (
		seen    = map[string]bool{}
		out     []*x509.Certificate
		sources []string
	)
	for _, s := range m.order {
		certs := m.parts[s]
		if len(certs) > 0 {
			sources = append(sources, s)
		}
		for _, c := range certs {
			if !seen[string(c.Raw)] {
				seen[string(c.Raw)] = true
				out = append(out, c)
			}
		}
	}
	return pki.NewBundle(out), sources
}

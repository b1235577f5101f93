package trust

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/promreg"
)

// Metrics counts what the trust sources and the merger do. A nil *Metrics
// counts nothing.
type Metrics struct {
	refusals *prometheus.CounterVec
	updates  *prometheus.CounterVec
	roots    prometheus.Gauge
}

// NewMetrics makes the meshagent_trust_* metrics and registers them with reg
// (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_trust_source_refusals_total",
			Help: "Trust bundles a source gave that were refused (did not parse, held no certificate, missing key); the source's last good roots stayed in the merged bundle.",
		}, []string{"source", "reason"}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_trust_bundle_updates_total",
			Help: "Changes of the merged trust bundle, by the source whose update caused them.",
		}, []string{"source"}),
		roots: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshagent_trust_bundle_roots",
			Help: "Certificates in the merged trust bundle.",
		}),
	}
	if reg != nil {
		m.refusals, _ = promreg.Register(reg, m.refusals)
		m.updates, _ = promreg.Register(reg, m.updates)
		m.roots, _ = promreg.Register(reg, m.roots)
	}
	return m
}

func (m *Metrics) refused(source, reason string) {
	if m != nil {
		m.refusals.WithLabelValues(source, reason).Inc()
	}
}

func (m *Metrics) updated(source string, roots int) {
	if m != nil {
		m.updates.WithLabelValues(source).Inc()
		m.roots.Set(float64(roots))
	}
}

// ErrMissing is a source whose object or key is not there (a ConfigMap that
// was deleted or lacks the key, a signer with no ClusterTrustBundle left).
var ErrMissing = errors.New("not found")

// Reason is a short, metric-label-safe name for a refusal: "missing",
// else pki.Reason's ("empty", "malformed").
func Reason(err error) string {
	if errors.Is(err, ErrMissing) {
		return "missing"
	}
	return pki.Reason(err)
}

package certfile

import (
	"github.com/meshagent/meshagent/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	failures *prometheus.CounterVec
	updates  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_certfile_load_failures_total",
			Help: "Loads of watched certificate files that were rejected; the last good value stayed in use.",
		}, []string{"kind", "reason"}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_certfile_updates_total",
			Help: "New values published from watched certificate files.",
		}, []string{"kind"}),
	}
	if reg != nil {
		m.failures = register(reg, m.failures)
		m.updates = register(reg, m.updates)
	}
	return m
}

// register registers c, or keeps the collector already registered under the
// same name, so that many sources can share one registry. A conflicting
// definition under the same name counts privately rather than fail; the
// conflict is a programming error that the metrics tests catch.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	c, _ = promreg.Register(reg, c)
	return c
}

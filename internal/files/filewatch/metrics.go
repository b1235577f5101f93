package filewatch

import (
	"github.com/meshagent/meshagent/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	failures *prometheus.CounterVec
	polling  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_filewatch_watch_failures_total",
			Help: "Directories that could not be watched (their files are re-read periodically instead), by reason.",
		}, []string{"reason"}),
		polling: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshagent_filewatch_polling_watchers",
			Help: "File watchers re-reading their files periodically because a directory cannot be watched.",
		}),
	}
	if reg != nil {
		m.failures = register(reg, m.failures)
		m.polling = register(reg, m.polling)
	}
	return m
}

// register registers c, or keeps the collector already registered under the
// same name, so that many watchers can share one registry; a conflicting
// definition counts privately.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	c, _ = promreg.Register(reg, c)
	return c
}

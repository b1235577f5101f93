package podcert

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/internal/promreg"
)

// Results of CA requests and bundle writes, the values of the "result" label.
const (
	resultSuccess = "success"
	resultCAError = "ca_error"
	resultError   = "error"
)

type metrics struct {
	requests   *prometheus.CounterVec
	caRequests *prometheus.CounterVec
	rejected   *prometheus.CounterVec
	latency    prometheus.Histogram
	inFlight   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_podcert_requests_total",
			Help: "PodCertificateRequests answered, by condition (issued, denied, failed).",
		}, []string{"condition"}),
		caRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_podcert_ca_requests_total",
			Help: "Certificate requests sent to the CA for PodCertificateRequests, by result (success, ca_error).",
		}, []string{"result"}),
		// Shared with the certificate cache: a rejected answer is counted
		// the same way whichever part asked.
		rejected: caclient.NewRejectedAnswers(),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "meshagent_podcert_ca_request_duration_seconds",
			Help:    "Time the CA took to answer one certificate request for a PodCertificateRequest.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshagent_podcert_csrs_in_flight",
			Help: "Certificate requests to the CA in flight for PodCertificateRequests (bounded by the agent's one CSR budget).",
		}),
	}
	if err := errors.Join(
		promreg.Assign(reg, &m.requests),
		promreg.Assign(reg, &m.caRequests),
		promreg.Assign(reg, &m.rejected),
		promreg.Assign(reg, &m.latency),
		promreg.Assign(reg, &m.inFlight),
	); err != nil {
		return nil, fmt.Errorf("registering pod certificate metrics: %w", err)
	}
	return m, nil
}

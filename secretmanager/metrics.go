package secretmanager

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Renewal results, the values of the "result" label.
const (
	resultSuccess  = "success"
	resultCAError  = "ca_error"
	resultRejected = "rejected"
	resultKeyError = "key_error"
)

type metrics struct {
	expiry    *prometheus.GaugeVec
	renewAt   *prometheus.GaugeVec
	renewals  *prometheus.CounterVec
	rejected  *prometheus.CounterVec
	caLatency prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshagent_secretmanager_cert_expiry_timestamp_seconds",
			Help: "Expiry (Unix seconds) of the certificate held under each resource name.",
		}, []string{"name"}),
		renewAt: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshagent_secretmanager_cert_renewal_timestamp_seconds",
			Help: "When (Unix seconds) the certificate held under each resource name will be renewed.",
		}, []string{"name"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_secretmanager_renewals_total",
			Help: "Certificate requests to the CA, by result (success, ca_error, rejected, key_error).",
		}, []string{"result"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_ca_answers_rejected_total",
			Help: "CA answers rejected before use, by reason.",
		}, []string{"reason"}),
		caLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "meshagent_secretmanager_ca_request_duration_seconds",
			Help:    "Time the CA took to answer a certificate request, including the client's own retries.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.expiry, m.renewAt, m.renewals, m.rejected, m.caLatency} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering secret manager metrics: %w", err)
		}
	}
	return m, nil
}

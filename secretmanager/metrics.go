package secretmanager

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/internal/promreg"
)

// Renewal results, the values of the "result" label.
const (
	resultSuccess  = "success"
	resultCAError  = "ca_error"
	resultRejected = "rejected"
	resultKeyError = "key_error"
	// resultDiscarded: a certificate arrived for an identity dropped while
	// its request was out.
	resultDiscarded = "discarded"
)

type metrics struct {
	expiry     *prometheus.GaugeVec
	renewAt    *prometheus.GaugeVec
	renewals   *prometheus.CounterVec
	rejected   *prometheus.CounterVec
	caLatency  prometheus.Histogram
	identities prometheus.Gauge
	inFlight   prometheus.Gauge
	dropped    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshagent_secretmanager_cert_expiry_timestamp_seconds",
			Help: "Expiry (Unix seconds) of the agent's own certificate (default) and of the trust bundle (ROOTCA).",
		}, []string{"name"}),
		renewAt: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshagent_secretmanager_cert_renewal_timestamp_seconds",
			Help: "When (Unix seconds) the agent's own certificate (default) will be renewed.",
		}, []string{"name"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_secretmanager_renewals_total",
			Help: "Certificate requests to the CA, by result (success, ca_error, rejected, key_error, discarded).",
		}, []string{"result"}),
		rejected: caclient.NewRejectedAnswers(),
		caLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "meshagent_secretmanager_ca_request_duration_seconds",
			Help:    "Time the CA took to answer one certificate request.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		identities: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshagent_secretmanager_identities",
			Help: "Identities held by the certificate cache (in use, or idle and not yet dropped).",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshagent_secretmanager_csrs_in_flight",
			Help: "Certificate requests to the CA in flight (bounded by the agent's one CSR budget).",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_secretmanager_identities_dropped_total",
			Help: "Identities dropped from the certificate cache after staying unused for the idle grace period.",
		}),
	}
	if err := errors.Join(
		promreg.Assign(reg, &m.expiry),
		promreg.Assign(reg, &m.renewAt),
		promreg.Assign(reg, &m.renewals),
		promreg.Assign(reg, &m.rejected),
		promreg.Assign(reg, &m.caLatency),
		promreg.Assign(reg, &m.identities),
		promreg.Assign(reg, &m.inFlight),
		promreg.Assign(reg, &m.dropped),
	); err != nil {
		return nil, fmt.Errorf("registering secret manager metrics: %w", err)
	}
	return m, nil
}

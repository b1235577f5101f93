package linkerd

import (
	"fmt"

	"github.com/meshagent/meshagent/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// Outcome labels that are not gRPC codes.
const (
	outcomeTokenError     = "token_error"
	outcomeUnverifiedPeer = "unverified_peer"
	outcomeMalformed      = "malformed_answer"
	outcomeClosed         = "closed"
	outcomeDialError      = "dial_error"
)

// Answer warning reasons.
const (
	warnValidUntilMissing  = "valid_until_missing"
	warnValidUntilInvalid  = "valid_until_invalid"
	warnValidUntilMismatch = "valid_until_mismatch"
)

type metrics struct {
	requests *prometheus.CounterVec
	latency  prometheus.Histogram
	warnings *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_linkerd_identity_requests_total",
			Help: "Certify calls to the Linkerd identity service, by outcome (a gRPC code, or token_error, unverified_peer, malformed_answer, dial_error, closed).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "meshagent_linkerd_identity_request_duration_seconds",
			Help:    "Time taken by Certify calls that reached the identity service.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		warnings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_linkerd_identity_answer_warnings_total",
			Help: "Certify answers accepted with a warning, by reason (valid_until_missing, valid_until_invalid, valid_until_mismatch).",
		}, []string{"reason"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.requests, err = register(reg, m.requests); err != nil {
		return nil, err
	}
	if m.latency, err = register(reg, m.latency); err != nil {
		return nil, err
	}
	if m.warnings, err = register(reg, m.warnings); err != nil {
		return nil, err
	}
	return m, nil
}

// register adds c to reg, or returns the collector already registered under
// the same description (a client rebuilt against the same registry).
func register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	c, err := promreg.Register(reg, c)
	if err != nil {
		return c, fmt.Errorf("registering metrics: %w", err)
	}
	return c, nil
}

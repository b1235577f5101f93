package linkerd

import (
	"errors"
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
	if err := errors.Join(
		promreg.Assign(reg, &m.requests),
		promreg.Assign(reg, &m.latency),
		promreg.Assign(reg, &m.warnings),
	); err != nil {
		return nil, fmt.Errorf("registering Linkerd identity client metrics: %w", err)
	}
	return m, nil
}

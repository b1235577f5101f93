package istio

import (
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/meshagent/meshagent/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Result labels besides the gRPC codes.
const (
	resultOK        = "ok"
	resultBadAnswer = "bad_answer"
	resultRefused   = "refused"
	resultFailed    = "failed"
)

// metrics counts CreateCertificate calls. Every try of a Sign call is one
// request.
type metrics struct {
	requests     *prometheus.CounterVec
	latency      prometheus.Histogram
	impersonated *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	labels := prometheus.Labels{"provider": "istio"}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "meshagent_ca_requests_total",
			Help:        "Certificate signing requests sent to the CA, by result: ok, bad_answer, or the gRPC code in snake case.",
			ConstLabels: labels,
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "meshagent_ca_request_duration_seconds",
			Help:        "Time from sending a certificate signing request to the CA's answer or failure.",
			ConstLabels: labels,
			Buckets:     prometheus.ExponentialBuckets(0.005, 2.5, 10),
		}),
		impersonated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_ca_impersonated_requests_total",
			Help: "Certificate signing requests made on behalf of another identity (node mode, ImpersonatedIdentity), " +
				"by result: ok, refused (the CA's node authorizer said no: Unauthenticated or PermissionDenied), failed (any other error).",
			ConstLabels: labels,
		}, []string{"result"}),
	}
	if err := errors.Join(
		promreg.Assign(reg, &m.requests),
		promreg.Assign(reg, &m.latency),
		promreg.Assign(reg, &m.impersonated),
	); err != nil {
		return nil, fmt.Errorf("registering Istio CA client metrics: %w", err)
	}
	return m, nil
}

// codeLabel turns a gRPC code into a metric label: DeadlineExceeded becomes
// deadline_exceeded.
func codeLabel(c codes.Code) string {
	name := c.String()
	var b strings.Builder
	prevLower := false
	for _, r := range name {
		if unicode.IsUpper(r) {
			if prevLower {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
			prevLower = false
		} else {
			prevLower = unicode.IsLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

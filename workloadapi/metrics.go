package workloadapi

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/internal/promreg"
)

// Method names, the values of the "method" label.
const (
	methodX509SVID    = "FetchX509SVID"
	methodX509Bundles = "FetchX509Bundles"
)

// Push reasons, the values of the "reason" label of pushes.
const (
	pushFirst  = "first"
	pushUpdate = "update"
)

// Refusal reasons, the values of the "reason" label of refused: the
// missing security header, or a stream over a limit (streamlimit.Refusal's
// reason).
const refusedHeader = "header"

type metrics struct {
	streams *prometheus.GaugeVec
	pushes  *prometheus.CounterVec
	errors  *prometheus.CounterVec
	refused *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshagent_workloadapi_streams",
			Help: "Open Workload API streams, by method.",
		}, []string{"method"}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_workloadapi_pushes_total",
			Help: "Workload API responses sent, by method and reason (first, update).",
		}, []string{"method", "reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_workloadapi_errors_total",
			Help: "Workload API streams that ended with an error, by method and gRPC code.",
		}, []string{"method", "code"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_workloadapi_refused_total",
			Help: "Workload API calls refused, by reason (header, max_streams, max_streams_per_caller).",
		}, []string{"reason"}),
	}
	if err := errors.Join(
		promreg.Assign(reg, &m.streams),
		promreg.Assign(reg, &m.pushes),
		promreg.Assign(reg, &m.errors),
		promreg.Assign(reg, &m.refused),
	); err != nil {
		return nil, fmt.Errorf("registering Workload API metrics: %w", err)
	}
	return m, nil
}

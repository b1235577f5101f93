package udsserver

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Refusal reasons, the values of the "reason" label of refused.
const (
	refusedUID        = "uid"
	refusedUnresolved = "unresolved"
)

type metrics struct {
	refused *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_socket_refused_total",
			Help: "RPCs on the local socket refused before reaching a service, by reason (uid: not an allowed uid; unresolved: the caller could not be identified).",
		}, []string{"reason"}),
	}
	if reg == nil {
		return m, nil
	}
	if err := reg.Register(m.refused); err != nil {
		return nil, fmt.Errorf("registering local socket metrics: %w", err)
	}
	return m, nil
}

package udsserver

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Refusal reasons, the values of the "reason" label of refused.
const (
	refusedUID         = "uid"
	refusedUnresolved  = "unresolved"
	refusedConnections = "max_connections"
	refusedUnary       = "max_unary"
	refusedQueued      = "max_queued_bytes"
	refusedGone        = "caller_gone"
	refusedRate        = "max_connection_rate"
	refusedHandshakes  = "handshakes"
)

type metrics struct {
	refused *prometheus.CounterVec
	rebound *prometheus.CounterVec
	conns   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_socket_refused_total",
			Help: "Connections and RPCs on the local socket refused before reaching a service, by reason (uid: not an allowed uid; unresolved: the caller could not be identified; max_connections, max_connection_rate, max_unary, max_queued_bytes: over a per-caller limit; handshakes: too many connections being identified at once; caller_gone: the caller's pod left). Connections refused when accepted are closed with an HTTP/2 GOAWAY naming the limit.",
		}, []string{"reason"}),
		rebound: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_socket_rebound_total",
			Help: "Times the local socket was bound again after it was removed or replaced by someone else, by reason (removed, replaced).",
		}, []string{"reason"}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshagent_socket_connections",
			Help: "Connections open on the local socket.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.refused, m.rebound, m.conns} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering local socket metrics: %w", err)
		}
	}
	return m, nil
}

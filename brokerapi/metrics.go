package brokerapi

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/internal/promreg"
)

// Method names, the values of the "method" label.
const (
	methodX509SVID    = "SubscribeToX509SVID"
	methodX509Bundles = "SubscribeToX509Bundles"
	methodJWTSVID     = "FetchJWTSVID"
	methodJWTBundles  = "SubscribeToJWTBundles"
)

// Refusal reasons, the values of the "reason" label of refused.
const (
	refusedHeader        = "header"
	refusedNotBroker     = "not_broker"
	refusedRefType       = "reference_type_not_allowed"
	refusedRefInvalid    = "reference_invalid"
	refusedNotFound      = "workload_not_found"
	refusedNotEntitled   = "workload_not_entitled"
	refusedMaxStreams    = "max_streams"
	refusedMaxWorkloads  = "max_workloads"
	refusedUnimplemented = "unimplemented"
)

type metrics struct {
	calls   *prometheus.CounterVec
	refused *prometheus.CounterVec
	streams prometheus.Gauge
	svids   prometheus.Counter
	ended   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_broker_calls_total",
			Help: "SPIFFE Broker API calls received, by method.",
		}, []string{"method"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_broker_refused_total",
			Help: "SPIFFE Broker API calls refused, by reason (header, not_broker, reference_type_not_allowed, reference_invalid, workload_not_found, workload_not_entitled, max_streams, max_workloads, unimplemented).",
		}, []string{"reason"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshagent_broker_streams",
			Help: "Open SPIFFE Broker API streams, all brokers together.",
		}),
		svids: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_broker_svids_sent_total",
			Help: "X.509-SVID responses sent to brokers (first ones and rotations).",
		}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_broker_streams_ended_total",
			Help: "SPIFFE Broker API streams ended by the agent, by reason (workload_left, error).",
		}, []string{"reason"}),
	}
	if err := errors.Join(
		promreg.Assign(reg, &m.calls),
		promreg.Assign(reg, &m.refused),
		promreg.Assign(reg, &m.streams),
		promreg.Assign(reg, &m.svids),
		promreg.Assign(reg, &m.ended),
	); err != nil {
		return nil, fmt.Errorf("registering broker API metrics: %w", err)
	}
	return m, nil
}

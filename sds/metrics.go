package sds

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/internal/promreg"
	"github.com/meshagent/meshagent/internal/uds/streamlimit"
)

// Push reasons, the values of the "reason" label of pushes.
const (
	pushRequest = "request"
	pushUpdate  = "update"
	pushFetch   = "fetch"
)

// Refusal reasons, the values of the "reason" label of refused: a stream
// over a limit (streamlimit.Refusal's reason), or a file resource over the
// caller's share (Config.MaxFileNamesPerCaller).
const (
	refusedStreams          = streamlimit.ReasonMaxStreams
	refusedStreamsPerCaller = streamlimit.ReasonMaxStreamsPerCaller
	refusedFileNames        = "max_file_names_per_caller"
)

type metrics struct {
	streams prometheus.Gauge
	pushes  *prometheus.CounterVec
	acks    prometheus.Counter
	nacks   prometheus.Counter
	stale   prometheus.Counter
	errors  *prometheus.CounterVec
	refused *prometheus.CounterVec
	// unavailable counts names a stream holds that became unavailable
	// (left out of its responses until they are available again).
	unavailable prometheus.Counter

	// The pushes counter of each reason, looked up once.
	pushRequest, pushUpdate, pushFetch prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshagent_sds_streams",
			Help: "Open StreamSecrets streams.",
		}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_sds_pushes_total",
			Help: "SDS responses sent, by reason (request, update, fetch).",
		}, []string{"reason"}),
		acks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_sds_acks_total",
			Help: "SDS responses acknowledged by the client.",
		}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_sds_nacks_total",
			Help: "SDS responses rejected by the client (requests with error_detail).",
		}),
		stale: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_sds_stale_requests_total",
			Help: "SDS requests ignored because they answer a response older than the latest.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_sds_errors_total",
			Help: "SDS streams and fetches that ended with an error, by gRPC code.",
		}, []string{"code"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_sds_refused_total",
			Help: "SDS streams and resources refused, by reason (max_streams, max_streams_per_caller, max_file_names_per_caller).",
		}, []string{"reason"}),
		unavailable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_sds_resources_unavailable_total",
			Help: "Times a resource name held by an SDS stream was not available (left out of the responses and pushed once it is; the stream's other names are served meanwhile).",
		}),
	}
	if err := errors.Join(
		promreg.Assign(reg, &m.streams),
		promreg.Assign(reg, &m.pushes),
		promreg.Assign(reg, &m.acks),
		promreg.Assign(reg, &m.nacks),
		promreg.Assign(reg, &m.stale),
		promreg.Assign(reg, &m.errors),
		promreg.Assign(reg, &m.refused),
		promreg.Assign(reg, &m.unavailable),
	); err != nil {
		return nil, fmt.Errorf("registering SDS metrics: %w", err)
	}
	m.pushRequest = m.pushes.WithLabelValues(pushRequest)
	m.pushUpdate = m.pushes.WithLabelValues(pushUpdate)
	m.pushFetch = m.pushes.WithLabelValues(pushFetch)
	return m, nil
}

package xdsproxy

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values of the direction label.
const (
	toUpstream   = "to_upstream"
	toDownstream = "to_downstream"
)

type metrics struct {
	connects          prometheus.Counter
	failures          *prometheus.CounterVec
	reconnects        prometheus.Counter
	messages          *prometheus.CounterVec
	bytes             *prometheus.CounterVec
	streams           *prometheus.GaugeVec
	rejectedRequests  prometheus.Counter
	droppedRequests   prometheus.Counter
	rewrittenRequests prometheus.Counter
	socketRebound     *prometheus.CounterVec
	ownResponses      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_xdsproxy_upstream_connects_total",
			Help: "Upstream ADS streams opened.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_xdsproxy_upstream_failures_total",
			Help: "Upstream ADS streams that could not be opened or broke, by gRPC status code.",
		}, []string{"code"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_xdsproxy_upstream_reconnects_total",
			Help: "Upstream ADS streams opened, with the subscriptions re-sent, to replace a failed or ended attempt for the same downstream stream.",
		}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_xdsproxy_messages_total",
			Help: "ADS messages forwarded, by direction.",
		}, []string{"direction"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_xdsproxy_bytes_total",
			Help: "ADS message bytes forwarded, by direction.",
		}, []string{"direction"}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshagent_xdsproxy_downstream_streams",
			Help: "Downstream ADS streams open now, by protocol (sotw, delta).",
		}, []string{"protocol"}),
		rejectedRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_xdsproxy_rejected_requests_total",
			Help: "Downstream requests refused as malformed; each ends its stream with InvalidArgument.",
		}),
		droppedRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_xdsproxy_dropped_requests_total",
			Help: "Downstream ACKs and NACKs not forwarded because they answer a response from a lost upstream stream.",
		}),
		rewrittenRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_xdsproxy_rewritten_requests_total",
			Help: "Downstream subscription changes forwarded with the nonce of the current upstream stream in place of a lost one's.",
		}),
		socketRebound: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_xdsproxy_socket_rebound_total",
			Help: "Times the xDS proxy's socket was bound again after it was removed or replaced by someone else, by reason (removed, replaced).",
		}, []string{"reason"}),
		ownResponses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_xdsproxy_own_responses_total",
			Help: "Responses to the proxy's own subscriptions (ProxyConfig), by type URL and result (ack, nack).",
		}, []string{"type_url", "result"}),
	}
	for _, d := range []string{toUpstream, toDownstream} {
		m.messages.WithLabelValues(d)
		m.bytes.WithLabelValues(d)
	}
	for _, p := range []string{protoSotw, protoDelta} {
		m.streams.WithLabelValues(p)
	}
	if reg == nil {
		return m, nil
	}
	var done []prometheus.Collector
	for _, c := range []prometheus.Collector{
		m.connects, m.failures, m.reconnects, m.messages, m.bytes, m.streams,
		m.rejectedRequests, m.droppedRequests, m.rewrittenRequests, m.socketRebound, m.ownResponses,
	} {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, fmt.Errorf("registering xds proxy metrics: %w", err)
		}
		done = append(done, c)
	}
	return m, nil
}

package podindex

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	pods       prometheus.Gauge
	identities prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		pods: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshagent_node_pods",
			Help: "Pods scheduled on the node, as the pod informer sees them.",
		}),
		identities: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshagent_node_identities",
			Help: "Workload identities with at least one pod on the node that has not terminated.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.pods, m.identities} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering pod index metrics: %w", err)
		}
	}
	return m, nil
}

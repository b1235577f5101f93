package podresolver

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	resolved *prometheus.CounterVec
	refused  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		resolved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_node_callers_resolved_total",
			Help: "Local callers given an identity, by kind (pod: from the pod's service account; node_uid: a node process by uid).",
		}, []string{"kind"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_node_callers_refused_total",
			Help: "Local callers refused, by reason (no_pid, process_gone, pid_reused, proc_unreadable, cgroup_invalid, node_process, container_runtime, static_pod, pod_unknown, pod_terminated, canceled).",
		}, []string{"reason"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.resolved, m.refused} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering caller resolver metrics: %w", err)
		}
	}
	return m, nil
}

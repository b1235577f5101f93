package app

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/secretmanager"
)

var (
	nodeIdentityPodsDesc = prometheus.NewDesc("meshagent_node_identity_pods",
		"Node mode: pods of the node using each identity (not terminated). Labelled by identity only, never by pod.",
		[]string{"identity"}, nil)
	nodeIdentityExpiryDesc = prometheus.NewDesc("meshagent_node_identity_cert_expiry_timestamp_seconds",
		"Node mode: expiry (Unix seconds) of the certificate held for each identity.",
		[]string{"identity"}, nil)
)

// nodeIdentityCollector reports, on each scrape, the pods and the
// certificate expiry of each identity of the node. Its series are those of
// the identities present now: an identity dropped leaves no stale series.
// The label set is bounded by the identities with a pod on the node (one
// per service account, however many pods share it).
type nodeIdentityCollector struct {
	m    *secretmanager.Manager
	pods func() map[string][]string
}

func (c nodeIdentityCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodeIdentityPodsDesc
	ch <- nodeIdentityExpiryDesc
}

func (c nodeIdentityCollector) Collect(ch chan<- prometheus.Metric) {
	for id, pods := range c.pods() {
		ch <- prometheus.MustNewConstMetric(nodeIdentityPodsDesc, prometheus.GaugeValue, float64(len(pods)), id)
	}
	for _, cert := range c.m.Certs() {
		if cert.ResourceName == secretmanager.WorkloadCertName {
			ch <- prometheus.MustNewConstMetric(nodeIdentityExpiryDesc, prometheus.GaugeValue, float64(cert.NotAfter.Unix()), cert.Identity)
		}
	}
}

package settings

import "strings"

// notImplemented are pilot-agent's settings (its environment variables, read
// in istio.io/istio's pilot-agent and pkg/istio-agent) that meshagent does
// not implement, each with what to do instead. A name ending in "_" stands
// for every variable with that prefix. Each is warned about by name when set
// (UnknownNames): pilot-agent would act on it, meshagent would not.
var notImplemented = []struct{ name, instead string }{
	{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "meshagent runs no Envoy whose connections it could count; a sidecar drains for PROXY_CONFIG terminationDrainDuration after SIGTERM (docs/operations.md)"},
	{"MINIMUM_DRAIN_DURATION", "pilot-agent reads it only with EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true, which meshagent does not implement; a sidecar drains for PROXY_CONFIG terminationDrainDuration (docs/operations.md)"},
	{"ISTIO_META_DNS_CAPTURE", "meshagent has no DNS proxy; keep pilot-agent in istio-proxy for DNS capture (docs/istio.md)"},
	{"ISTIO_META_DNS_AUTO_ALLOCATE", "meshagent has no DNS proxy; keep pilot-agent in istio-proxy for DNS auto-allocation (docs/istio.md)"},
	{"ISTIO_META_ENABLE_DNS_SERVER", "meshagent has no DNS proxy; keep pilot-agent in istio-proxy for DNS (docs/istio.md)"},
	{"DNS_PROXY_ADDR", "meshagent has no DNS proxy; remove it"},
	{"DNS_FORWARD_PARALLEL", "meshagent has no DNS proxy; remove it"},
	{"DNS_FORWARD_TIMEOUT", "meshagent has no DNS proxy; remove it"},
	{"PROXY_XDS_VIA_AGENT", "meshagent always proxies xDS when its proxy is on: use MESHAGENT_XDS_PROXY"},
	{"ENVOY_", "meshagent starts no Envoy: pilot-agent does (docs/istio.md); remove it"},
	{"ISTIO_PROMETHEUS_ANNOTATIONS", "meshagent merges no application metrics: its own are on /stats/prometheus of the status port"},
	{"WASM_", "meshagent fetches no Wasm modules (Envoy's, through pilot-agent); remove it"},
	{"ISTIO_ENABLE_HTTP2_PROBING", "meshagent rewrites no application probes: pilot-agent's status server does"},
	{"REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", "meshagent rewrites no application probes: pilot-agent's status server does"},
	{"ENABLE_PROBE_KEEPALIVE_CONNECTIONS", "meshagent rewrites no application probes: pilot-agent's status server does"},
	{"PEER_METADATA_DISCOVERY", "meshagent serves no peer metadata: Envoy's and pilot-agent's concern"},
	{"ISTIO_META_ENABLE_SELF_DISCOVERY", "meshagent serves no peer metadata: Envoy's and pilot-agent's concern"},
	{"ISTIO_META_ENABLE_HBONE", "meshagent does not tunnel traffic (HBONE): keep pilot-agent or ztunnel for it"},
}

// notImplementedNames warns about every variable of env that names a
// pilot-agent setting meshagent does not implement (notImplemented).
func notImplementedNames(env []string) []Warning {
	var out []Warning
	seen := map[string]bool{}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if seen[name] || strings.HasPrefix(name, meshagentPrefix) {
			continue
		}
		for _, n := range notImplemented {
			if name == n.name || (strings.HasSuffix(n.name, "_") && strings.HasPrefix(name, n.name)) {
				seen[name] = true
				out = append(out, Warning{Name: name, Value: name, Why: "a pilot-agent setting meshagent does not implement: " + n.instead})
				break
			}
		}
	}
	return out
}

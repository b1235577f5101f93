package settings

import (
	"bytes"
	"encoding/json"
	"slices"
	"sort"
	"strings"
)

// meshagentPrefix starts every variable of meshagent's own.
const meshagentPrefix = "MESHAGENT_"

// developerVariables are MESHAGENT_ variables the repository's tests and
// tools read, not the agent: a developer's shell may hold them.
var developerVariables = []string{"MESHAGENT_TOOLS_DIR", "MESHAGENT_TEST_AGENT_BIN", "MESHAGENT_E2E_KEEP"}

// proxyConfigFields are the JSON names of Istio's ProxyConfig
// (istio.io/api mesh.v1alpha1.ProxyConfig; a test keeps the list equal to
// the proto). Their proto names (snake_case) are accepted too.
var proxyConfigFields = []string{
	"configPath", "binaryPath", "serviceCluster", "tracingServiceName", "drainDuration", "discoveryAddress",
	"discoveryRefreshDelay", "zipkinAddress", "statsdUdpAddress", "envoyMetricsServiceAddress", "proxyAdminPort",
	"availabilityZone", "controlPlaneAuthPolicy", "customConfigFile", "statNameLength", "concurrency",
	"proxyBootstrapTemplatePath", "interceptionMode", "tracing", "sds", "envoyAccessLogService",
	"envoyMetricsService", "proxyMetadata", "runtimeValues", "statusPort", "extraStatTags", "gatewayTopology",
	"terminationDrainDuration", "meshId", "readinessProbe", "proxyStatsMatcher", "holdApplicationUntilProxyStarts",
	"caCertificatesPem", "image", "privateKeyProvider", "proxyHeaders", "fileFlushInterval", "fileFlushMinSizeKb",
	"statsCompression", "connectionSettings",
}

// UnknownNames warns about the names in env that look meant for the agent
// but that it does not know, each with the nearest known name: a
// MESHAGENT_ variable no setting declares, and a top-level PROXY_CONFIG
// field Istio's ProxyConfig does not have (such a value is otherwise
// ignored without a word), and a pilot-agent setting meshagent does not
// implement (notimplemented.go). Warning.Name is the variable, Value the
// unknown name (the value for a pilot-agent setting).
func UnknownNames(env []string) []Warning {
	var out []Warning
	known := knownVariables()
	seen := map[string]bool{}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, meshagentPrefix) || seen[name] || isKnownVariable(name, known) {
			continue
		}
		seen[name] = true
		out = append(out, Warning{Name: name, Value: name, Why: "no such setting" + didYouMean(name, known)})
	}
	out = append(out, notImplementedNames(env)...)
	if raw, ok := envMap(env)["PROXY_CONFIG"]; ok {
		for _, f := range unknownProxyConfigFields(raw) {
			out = append(out, Warning{Name: "PROXY_CONFIG", Value: f, Why: "field " + f + " is not a field of Istio's ProxyConfig" + didYouMean(f, proxyConfigFields)})
		}
	}
	return out
}

// knownVariables are the declared variables, prefix settings by their
// prefix ("CA_HEADER_").
func knownVariables() []string {
	names := make([]string, 0, len(Registry))
	for i := range Registry {
		s := &Registry[i]
		if prefix, ok := s.Prefix(); ok {
			names = append(names, prefix)
			continue
		}
		names = append(names, s.Name)
	}
	return names
}

func isKnownVariable(name string, known []string) bool {
	if slices.Contains(developerVariables, name) {
		return true
	}
	for _, k := range known {
		if name == k || (strings.HasSuffix(k, "_") && strings.HasPrefix(name, k)) {
			return true
		}
	}
	return false
}

// unknownProxyConfigFields are the top-level fields of the JSON object raw
// that ProxyConfig does not have, sorted; none when raw is not an object
// (ParseProxyConfig refuses it).
func unknownProxyConfigFields(raw string) []string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(bytes.TrimSpace([]byte(raw)), &m); err != nil {
		return nil
	}
	var out []string
	for f := range m {
		if !slices.Contains(proxyConfigFields, f) && !slices.Contains(proxyConfigFields, snakeToCamel(f)) {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

// snakeToCamel turns a proto field name (discovery_address) into its JSON
// name (discoveryAddress).
func snakeToCamel(s string) string {
	parts := strings.Split(s, "_")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}

// didYouMean is "; did you mean X?" for the known name nearest to name
// (edit distance, ignoring case), or "" when none is near.
func didYouMean(name string, known []string) string {
	best, bestD := "", len(name)/3+2
	for _, k := range known {
		if d := editDistance(strings.ToLower(name), strings.ToLower(k)); d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" {
		return ""
	}
	return "; did you mean " + best + "?"
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Unknown returns UnknownNames of the environment the Config was resolved
// from.
func (c *Config) Unknown() []Warning { return c.unknown }

package settings

import (
	"slices"
	"strings"
	"testing"
)

// A pilot-agent setting meshagent does not implement is warned about by
// name, with its value and what to do; one meshagent implements, or a
// variable of nobody's, is not.
func TestPilotAgentSettingsNotImplementedAreNamed(t *testing.T) {
	got := UnknownNames([]string{
		"EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true", "ISTIO_META_DNS_CAPTURE=true", "ISTIO_META_DNS_AUTO_ALLOCATE=true",
		"PROXY_XDS_VIA_AGENT=true", "ENVOY_STATUS_PORT=15021", "WASM_MODULE_EXPIRY=1h",
		"ISTIO_META_CLUSTER_ID=Kubernetes", "OUTPUT_CERTS=/x", "HOME=/root",
	})
	names := make([]string, 0, len(got))
	for _, w := range got {
		names = append(names, w.Name)
		if !strings.HasPrefix(w.Why, "a pilot-agent setting meshagent does not implement: ") || len(w.Why) < 60 {
			t.Errorf("%s: %q says nothing of what to do", w.Name, w.Why)
		}
	}
	want := []string{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "ISTIO_META_DNS_CAPTURE", "ISTIO_META_DNS_AUTO_ALLOCATE",
		"PROXY_XDS_VIA_AGENT", "ENVOY_STATUS_PORT", "WASM_MODULE_EXPIRY"}
	if !slices.Equal(names, want) {
		t.Errorf("warned about %q, want %q", names, want)
	}
}

// No setting of the registry is in the list of those not implemented.
func TestNotImplementedAreNotSettings(t *testing.T) {
	for _, n := range notImplemented {
		for i := range Registry {
			name := Registry[i].Name
			if name == n.name || (strings.HasSuffix(n.name, "_") && strings.HasPrefix(name, n.name)) {
				t.Errorf("%s is a setting and listed as not implemented (%s)", name, n.name)
			}
		}
	}
}

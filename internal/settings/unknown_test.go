package settings

import (
	"slices"
	"testing"

	meshv1 "istio.io/api/mesh/v1alpha1"
)

func TestUnknownNamesSuggestTheNearest(t *testing.T) {
	got := UnknownNames([]string{
		"MESHAGENT_DEVV=true", "MESHAGENT_DEV=true", "MESHAGENT_TOOLS_DIR=/x", "CA_HEADER_X=1", "HOME=/root",
		"MESHAGENT_ZZZZZZZZZZZZZZZZZZZZ=1",
		`PROXY_CONFIG={"discoveryAdress":"a:1","statusPort":1,"proxy_metadata":{},"concurrency":2}`,
	})
	want := []Warning{
		{Name: "MESHAGENT_DEVV", Value: "MESHAGENT_DEVV", Why: "no such setting; did you mean MESHAGENT_DEV?"},
		{Name: "MESHAGENT_ZZZZZZZZZZZZZZZZZZZZ", Value: "MESHAGENT_ZZZZZZZZZZZZZZZZZZZZ", Why: "no such setting"},
		{Name: "PROXY_CONFIG", Value: "discoveryAdress", Why: "field discoveryAdress is not a field of Istio's ProxyConfig; did you mean discoveryAddress?"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

// TestProxyConfigFieldsAreIstios keeps proxyConfigFields equal to the
// proto's fields, and their proto names what snakeToCamel reads.
func TestProxyConfigFieldsAreIstios(t *testing.T) {
	fs := (&meshv1.ProxyConfig{}).ProtoReflect().Descriptor().Fields()
	var names []string
	for i := range fs.Len() {
		f := fs.Get(i)
		names = append(names, f.JSONName())
		if got := snakeToCamel(string(f.Name())); got != f.JSONName() {
			t.Errorf("snakeToCamel(%s) = %s, want %s", f.Name(), got, f.JSONName())
		}
	}
	if !slices.Equal(names, proxyConfigFields) {
		t.Errorf("ProxyConfig's fields are %q;\nproxyConfigFields has %q", names, proxyConfigFields)
	}
}

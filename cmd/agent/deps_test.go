package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/test/agentproc"
)

// TestDependencyGraphStaysSmall fails when a package that only adds size
// and start-up cost enters the agent binary. Every linked package's code,
// type data and init run at every start and count in every sidecar's
// resident memory: client-go's clientset and its scheme alone took the
// binary from 28 MB to 80 MB and idle RSS from 20 MB to 40 MB, by linking
// every API group. The agent talks to the API server through package
// kubeclient, which links only what it sends and receives (pods are its own
// small kubeclient.Pod). Tests may import anything: test imports do not
// reach the binary.
func TestDependencyGraphStaysSmall(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", agentproc.BuildTags, "-deps", ".").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps (the go command is needed for this test): %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps listed %d packages; expected the agent's whole graph", len(deps))
	}
	banned := []struct{ prefix, why string }{
		{"k8s.io/client-go/kubernetes", "the clientset links every API group; use kubeclient"},
		{"k8s.io/client-go/applyconfigurations", "apply configurations of every API group"},
		{"k8s.io/client-go/informers", "informer factories of every API group; use cache.NewSharedIndexInformer with kubeclient"},
		{"k8s.io/client-go/dynamic", "not needed; use kubeclient"},
		{"k8s.io/api/apps/", "an API group the agent does not use"},
		{"k8s.io/api/core/", "core/v1's generated code is ~5 MB; pods are kubeclient.Pod"},
		{"golang.org/x/net/trace", "gRPC links it unless built with -tags grpcnotrace"},
		{"html/template", "its reflective method calls keep every exported method of every type in an interface linked (~8 MB)"},
	}
	allowedAPI := map[string]bool{"k8s.io/api/authentication/v1": true}
	for _, p := range deps {
		for _, b := range banned {
			if p == b.prefix || strings.HasPrefix(p, b.prefix+"/") || (strings.HasSuffix(b.prefix, "/") && strings.HasPrefix(p, b.prefix)) {
				t.Errorf("%s is in the agent's dependency graph: %s", p, b.why)
			}
		}
		if strings.HasPrefix(p, "k8s.io/api/") && !allowedAPI[p] && !strings.HasPrefix(p, "k8s.io/api/core/") && !strings.HasPrefix(p, "k8s.io/api/apps/") {
			t.Errorf("%s is in the agent's dependency graph: only %v of k8s.io/api are expected; each group adds generated code to every start", p, keys(allowedAPI))
		}
	}
	if t.Failed() {
		t.Log("find who imports a package: go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./cmd/agent | grep <package>")
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

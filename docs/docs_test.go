// Package docs holds the user documentation; its test keeps the reference
// pages that list what the code defines (metrics, readiness checks) current.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// agentSources returns the agent's non-test Go files (what the binary is
// built from, not the test tools or benchmarks).
func agentSources(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "test", "tools", "meshbench", "meshsoak", ".run", ".tools", ".git":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out[path] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var metricName = regexp.MustCompile(`"(meshagent_[a-z0-9_]+)"`)

// TestEveryMetricIsInMetricsMD: each metric name the agent's code holds
// is in docs/metrics.md's reference, and each metric an example alert uses
// exists.
func TestEveryMetricIsInMetricsMD(t *testing.T) {
	doc := readDoc(t, "metrics.md")
	var names []string
	for path, src := range agentSources(t) {
		for _, m := range metricName.FindAllStringSubmatch(src, -1) {
			if !strings.Contains(doc, "| `"+m[1]+"` |") {
				t.Errorf("%s registers %s, which docs/metrics.md does not list", path, m[1])
			}
			names = append(names, m[1])
		}
	}
	if len(names) < 50 {
		t.Fatalf("found only %d metric names in the sources: the scan is broken", len(names))
	}
	rules := readDoc(t, "../deploy/helm/meshagent/files/prometheus-rules.yaml")
	for _, m := range regexp.MustCompile(`meshagent_[a-z0-9_]+`).FindAllString(rules, -1) {
		if !slices.Contains(names, m) {
			t.Errorf("an example alert uses %s, which no code registers", m)
		}
	}
	if !strings.Contains(doc, "```yaml\n"+rules+"```") {
		t.Error("docs/metrics.md's example alerts differ from deploy/helm/meshagent/files/prometheus-rules.yaml (the chart's PrometheusRule)")
	}
}

var readinessName = regexp.MustCompile(`AddReadiness\("([a-z_]+)"`)

// TestEveryNotReadyReasonIsInTroubleshooting: each readiness check the
// code registers has its row in docs/troubleshooting.md.
func TestEveryNotReadyReasonIsInTroubleshooting(t *testing.T) {
	doc := readDoc(t, "troubleshooting.md")
	n := 0
	for path, src := range agentSources(t) {
		for _, m := range readinessName.FindAllStringSubmatch(src, -1) {
			n++
			if !strings.Contains(doc, "| `"+m[1]+"`") {
				t.Errorf("%s registers readiness check %s, which docs/troubleshooting.md does not explain", path, m[1])
			}
		}
	}
	if n < 5 {
		t.Fatalf("found only %d readiness checks: the scan is broken", n)
	}
}

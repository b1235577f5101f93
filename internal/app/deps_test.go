package app

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/meshagent/meshagent/"

// components are the running parts; settings and the shared packages know
// none of them, and they know no settings (docs/architecture.md,
// "Dependencies").
var components = []string{"caclient", "credfetcher", "podcert", "sds", "secretmanager", "workloadapi", "xdsproxy", "internal/uds/udsserver"}

// knownDependencies are the edges against the rules still to be cut, each
// to go; the list may only shrink.
var knownDependencies = []string{
	"internal/settings -> internal/uds/udsserver", // the socket limits' defaults
	"internal/settings -> sds",                    // the stream limits' defaults
	"internal/settings -> secretmanager",          // the cache's defaults
	"internal/settings -> workloadapi",            // the stream limit's default
}

// The packages import one another in one direction only: internal/settings
// and the shared packages under internal/files import no component, and no
// component imports internal/settings or internal/app.
func TestDependenciesOneWay(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var found []string
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 || !strings.HasPrefix(fields[0], module) {
			continue
		}
		from := strings.TrimPrefix(fields[0], module)
		for _, imp := range fields[1:] {
			to, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			if edge := from + " -> " + to; against(from, to) {
				found = append(found, edge)
			}
		}
	}
	for _, e := range found {
		if !slices.Contains(knownDependencies, e) {
			t.Errorf("%s: against the direction of docs/architecture.md", e)
		}
	}
	for _, e := range knownDependencies {
		if !slices.Contains(found, e) {
			t.Errorf("%s is gone: take it off knownDependencies", e)
		}
	}
}

// against reports whether from may not import to.
func against(from, to string) bool {
	isComponent := func(p string) bool {
		return slices.ContainsFunc(components, func(c string) bool { return p == c || strings.HasPrefix(p, c+"/") })
	}
	switch {
	case from == "internal/settings" || strings.HasPrefix(from, "internal/files/") || from == "internal/files":
		return isComponent(to)
	case isComponent(from):
		return to == "internal/settings" || to == "internal/app"
	}
	return false
}

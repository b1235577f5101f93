package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/test/agentproc"
)

// TestLinkerDropsUnusedMethods builds the agent as `make build` does and
// fails if the linker kept methods nothing calls. A reachable reflective
// method call by name (reflect.Value.MethodByName with a name known only at
// run time, as text/template's and html/template's execution make) makes the
// linker keep every exported method of every type put in an interface: the
// Envoy types' generated Validate code, most of apimachinery's methods. Cobra
// runs a text/template only for a custom help, usage or version template
// (cobra's Version field with SetVersionTemplate did): that cost the binary
// ~4 MB of text and tables, all of it mapped in every sidecar
// (docs/performance.md).
func TestLinkerDropsUnusedMethods(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "meshagent")
	if out, err := agentproc.BuildCommand(ctx, bin).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(ctx, "go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	syms := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 3 {
			syms[f[len(f)-1]] = true
		}
	}
	if len(syms) < 1000 {
		t.Fatalf("go tool nm listed %d symbols; expected the whole binary", len(syms))
	}
	for _, s := range []string{
		// The Envoy type the agent uses most; nothing calls its validation.
		"github.com/envoyproxy/go-control-plane/envoy/config/core/v3.(*Node).ValidateAll",
		"github.com/envoyproxy/go-control-plane/envoy/config/core/v3.(*Address).Validate",
		// text/template's evaluation, which calls methods by name.
		"text/template.(*state).evalField",
	} {
		if syms[s] {
			t.Errorf("%s is linked: a reflective call by method name is reachable (find it with go build -ldflags=-dumpdep)", s)
		}
	}
}

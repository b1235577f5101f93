package agentproc

import (
	"os"
	"strings"
	"testing"
)

// TestMakefileBuildsTheSameBinary keeps `make build` and BuildCommand in step:
// the end-to-end tests and the benchmarks must measure the binary users get.
func TestMakefileBuildsTheSameBinary(t *testing.T) {
	data, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var recipe string
	lines := strings.Split(string(data), "\n")
	for i, line := range lines {
		if line == "build:" && i+1 < len(lines) {
			recipe = lines[i+1]
		}
	}
	if recipe == "" {
		t.Fatal("no build: target in the Makefile")
	}
	want := append([]string{"-tags " + BuildTags, "./cmd/agent"}, BuildEnv...)
	for _, w := range want {
		if !strings.Contains(recipe, w) {
			t.Errorf("the Makefile's build recipe %q lacks %q (BuildCommand uses it)", recipe, w)
		}
	}
}

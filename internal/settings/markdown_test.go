package settings

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md from the registry")

const docPath = "../../docs/configuration.md"

// TestConfigurationDocIsCurrent fails when docs/configuration.md differs from
// what the registry generates. Run `make docs` (or this test with -update).
func TestConfigurationDocIsCurrent(t *testing.T) {
	t.Parallel()
	want := append(Markdown(), '\n')
	if *update {
		if err := os.WriteFile(docPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatalf("%v (run make docs)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale: run `make docs` and commit the result", filepath.Clean(docPath))
	}
}

func TestMarkdownMentionsEverySetting(t *testing.T) {
	t.Parallel()
	doc := string(Markdown())
	for _, s := range Registry {
		if !strings.Contains(doc, "### "+md(s.Name)+"\n") {
			t.Errorf("no section for %s", s.Name)
		}
		if !strings.Contains(doc, md(s.Doc)) {
			t.Errorf("doc of %s missing", s.Name)
		}
		if s.Flag != "" && !strings.Contains(doc, "`--"+s.Flag+"`") {
			t.Errorf("flag of %s missing", s.Name)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

package secretmanager

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The cache knows no transport and no status page: the edges (sds,
// workloadapi, podcert) resolve the caller and pass its identity in, and
// internal/app converts CertInfo for /debug/certs.
func TestImportsNoTransport(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []string{"/internal/uds/", "/internal/status", "/sds", "/workloadapi"}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, bad := range forbidden {
				if strings.Contains(path, "meshagent/meshagent"+bad) {
					t.Errorf("%s imports %s", name, path)
				}
			}
		}
	}
}

package settings

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// quotedName is how error and log texts name a setting of the agent's own.
var quotedName = regexp.MustCompile(`\bMESHAGENT_[A-Z0-9_]*[A-Z0-9]\b`)

// Every setting name quoted in the program's strings (error texts, log
// lines, help) is one the registry declares: a renamed or removed setting
// leaves no text telling users to set a variable that does nothing.
func TestQuotedSettingNamesExist(t *testing.T) {
	t.Parallel()
	known := map[string]bool{}
	for _, s := range Registry {
		known[s.Name] = true
	}
	// The variables of the repository's tests and tools, named so that
	// unknown-name warnings leave them alone.
	for _, name := range developerVariables {
		known[name] = true
	}
	root := filepath.Join("..", "..")
	var files int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "test", "tools", "cmd/meshbench", "cmd/meshsoak", ".git":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		files++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			text, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			for _, name := range quotedName.FindAllString(text, -1) {
				if !known[name] {
					t.Errorf("%s: %q names no setting of the registry", fset.Position(lit.Pos()), name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read %d Go files under %s; the walk missed the tree", files, root)
	}
}

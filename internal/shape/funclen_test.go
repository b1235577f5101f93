package shape

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// exempt are the trees the limit does not apply to.
var exempt = map[string]bool{".git": true, "cmd/meshbench": true, "cmd/meshsoak": true}

// No function of the program, its tools or its test helpers is longer than
// MaxFuncLines (test functions in _test.go files are exempt: a table and
// its checks read best in one place).
func TestFunctionLength(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	var files, long int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if exempt[filepath.ToSlash(rel)] {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
			if n := end.Line - start.Line + 1; n > MaxFuncLines {
				long++
				t.Errorf("%s:%d: %s is %d lines, more than %d", rel, start.Line, fn.Name.Name, n, MaxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read %d Go files under %s; the walk missed the tree", files, root)
	}
	t.Logf("%d Go files read, %d functions over %d lines", files, long, MaxFuncLines)
}

package logkeys_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// keyless are the zap field constructors that take no key.
var keyless = map[string]bool{"Error": true, "Inline": true, "Skip": true}

// Every zap field of the module's code takes its key from this package:
// zap.String(logkeys.Pod, ...), never zap.String("pod", ...) nor a key of a
// package's own.
func TestEveryFieldKeyIsInTheTable(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var bad []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name != "." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		zapName := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"go.uber.org/zap"` {
				zapName = "zap"
				if imp.Name != nil {
					zapName = imp.Name.Name
				}
			}
		}
		if zapName == "" {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != zapName || !ast.IsExported(sel.Sel.Name) || keyless[sel.Sel.Name] || !fieldConstructor(sel.Sel.Name) {
				return true
			}
			if key, ok := call.Args[0].(*ast.SelectorExpr); ok {
				if pkg, ok := key.X.(*ast.Ident); ok && pkg.Name == "logkeys" {
					return true
				}
			}
			rel, _ := filepath.Rel(root, fset.Position(call.Pos()).Filename)
			bad = append(bad, rel+":"+strconv.Itoa(fset.Position(call.Pos()).Line)+": zap."+sel.Sel.Name+" with a key not from logkeys")
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Error(b)
	}
}

// fieldConstructor reports whether zap.name makes a Field from a key (the
// package's other exported functions build loggers and options).
func fieldConstructor(name string) bool {
	switch name {
	case "New", "NewNop", "NewProduction", "NewDevelopment", "NewExample", "Must", "L", "S",
		"ReplaceGlobals", "RedirectStdLog", "RedirectStdLogAt", "NewStdLog", "NewStdLogAt",
		"NewProductionConfig", "NewDevelopmentConfig", "NewProductionEncoderConfig",
		"NewDevelopmentEncoderConfig", "NewAtomicLevel", "NewAtomicLevelAt", "ParseAtomicLevel",
		"AddCaller", "AddCallerSkip", "AddStacktrace", "Development", "ErrorOutput", "Fields",
		"Hooks", "IncreaseLevel", "OnFatal", "WithCaller", "WithClock", "WithFatalHook",
		"WithPanicHook", "WrapCore", "RegisterSink", "RegisterEncoder", "Open", "CombineWriteSyncers",
		"LevelFlag", "NewLogger", "Dict", "Objects", "ObjectValues", "Stringers":
		return false
	}
	return true
}

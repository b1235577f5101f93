package main

import (
	"go/parser"
	"go/token"
	"io"
	"strings"
	"testing"
)

// The package comment lists every subcommand a user can see, and no other.
func TestPackageDocListsEverySubcommand(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(f.Doc.Text(), "\n") {
		if name, _, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "- "), " ("); ok && strings.HasPrefix(strings.TrimSpace(line), "- ") {
			listed[name] = true
		}
	}
	for _, c := range newRootCommand(nil, io.Discard, io.Discard, hooks{}).Commands() {
		if c.Hidden {
			continue
		}
		if !listed[c.Name()] {
			t.Errorf("the package comment does not list the subcommand %q", c.Name())
		}
		delete(listed, c.Name())
	}
	for name := range listed {
		t.Errorf("the package comment lists %q, which is no subcommand", name)
	}
}

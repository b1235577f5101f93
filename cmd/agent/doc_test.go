package main

import (
	"go/parser"
	"go/token"
	"io"
	"strings"
	"testing"
)

// The package comment names every subcommand a user can see.
func TestPackageDocListsEverySubcommand(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	doc := f.Doc.Text()
	for _, c := range newRootCommand(nil, io.Discard, io.Discard, hooks{}).Commands() {
		if c.Hidden {
			continue
		}
		if !strings.Contains(doc, c.Name()+" (") {
			t.Errorf("the package comment does not list the subcommand %q", c.Name())
		}
	}
}

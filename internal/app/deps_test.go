package app

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/internal/settings"
)

const module = "github.com/meshagent/meshagent/"

// components are the running parts (docs/architecture.md, "Dependencies"),
// each with its subpackages: they import no settings package and no
// internal/app. internal/controlplane is the connection the CA clients and
// the xDS proxy dial; internal/csi is the CSI node plugin (`meshagent
// csi`); internal/files/grpcbootstrap writes the file the xDS clients read;
// the trust publisher is podcert's Publisher.
var components = []string{
	"brokerapi", "caclient", "credfetcher", "podcert", "sds", "secretmanager", "workloadapi", "xdsproxy",
	"internal/controlplane", "internal/csi", "internal/files/grpcbootstrap", "internal/node", "internal/status", "internal/uds",
}

// roots are the packages that wire components together or are programs:
// they may import anything.
var roots = []string{"internal/app", "cmd", "test", "tools"}

// The packages import one another in one direction only: internal/settings
// and every shared package (internal/files, internal/pki, internal/secret,
// ...) import no component, and no component imports internal/settings or
// internal/app. No exception.
func TestDependenciesOneWay(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs int
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 || !strings.HasPrefix(fields[0], module) {
			continue
		}
		pkgs++
		from := strings.TrimPrefix(fields[0], module)
		for _, imp := range fields[1:] {
			to, ok := strings.CutPrefix(imp, module)
			if ok && against(from, to) {
				t.Errorf("%s -> %s: against the direction of docs/architecture.md", from, to)
			}
		}
	}
	if pkgs < 50 {
		t.Fatalf("go list named %d packages of the module; the listing missed the tree", pkgs)
	}
}

func TestAgainst(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		from, to string
		want     bool
	}{
		{"internal/settings", "sds", true},
		{"internal/settings", "internal/pki", false},
		{"internal/files/certfile", "secretmanager", true},
		{"internal/files/grpcbootstrap", "internal/files", false},
		{"internal/pki", "internal/uds/caller", true},
		{"sds", "internal/settings", true},
		{"internal/uds/udsserver", "internal/app", true},
		{"podcert", "secretmanager", false},
		{"internal/app", "sds", false},
		{"cmd/agent", "internal/settings", false},
	} {
		if got := against(tt.from, tt.to); got != tt.want {
			t.Errorf("against(%s, %s) = %v, want %v", tt.from, tt.to, got, tt.want)
		}
	}
}

// against reports whether from may not import to.
func against(from, to string) bool {
	under := func(p string, list []string) bool {
		return slices.ContainsFunc(list, func(c string) bool { return p == c || strings.HasPrefix(p, c+"/") })
	}
	switch {
	case under(from, roots):
		return false
	case under(from, components):
		return to == "internal/settings" || strings.HasPrefix(to, "internal/settings/") || to == "internal/app"
	}
	// internal/settings and the shared packages.
	return under(to, components) || to == "internal/app"
}

// No component quotes a setting's name in its code: its errors name its
// Config fields, and internal/app maps them to the settings (settingError)
// or passes the names a component shows (streamlimit.Names,
// udsserver.LimitNames).
func TestComponentsQuoteNoSetting(t *testing.T) {
	t.Parallel()
	names := map[string]bool{}
	for _, s := range settings.Registry {
		if p, ok := s.Prefix(); ok {
			names[strings.TrimSuffix(p, "_")] = true
			continue
		}
		names[s.Name] = true
	}
	word := regexp.MustCompile(`[A-Z][A-Z0-9_]*[A-Z0-9]`)
	var files int
	for _, c := range components {
		root := filepath.Join("..", "..", filepath.FromSlash(c))
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				return err
			}
			files++
			ast.Inspect(f, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					for _, w := range word.FindAllString(lit.Value, -1) {
						if names[w] {
							t.Errorf("%s quotes the setting %s: name the Config field, and let internal/app name the setting", path, w)
						}
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files < 50 {
		t.Fatalf("read %d files of the components; the walk missed them", files)
	}
}

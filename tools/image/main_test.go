package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// tarEntry is what the test reads back of one layer entry.
type tarEntry struct {
	typ      byte
	mode     int64
	uid, gid int
	data     string
}

// readImage reads the archive back the way a container runtime would: the one layer's
// entries and the config.
func readImage(t *testing.T, archive, tag string) (map[string]tarEntry, []string, string) {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &ref)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string]tarEntry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = tarEntry{typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid, data: string(b)}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return out, cfg.Config.Entrypoint, cfg.Config.User
}

func TestBuildWithAddedFilesAndDirectories(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	agent := write("pilot-agent", "agent-binary")
	envoy := write("envoy", "envoy-binary")
	tmpl := write("tmpl.json", `{"admin":{}}`)
	var o options
	o.binary, o.target, o.tag, o.user, o.arch = agent, "/usr/local/bin/pilot-agent", "example/proxyv2:dev", "1337:1337", "amd64"
	o.out = filepath.Join(dir, "img.tar")
	for _, v := range []string{envoy + ":/usr/local/bin/envoy", tmpl + ":/var/lib/istio/envoy/envoy_bootstrap_tmpl.json:0644"} {
		a, err := parseAdd(v)
		if err != nil {
			t.Fatal(err)
		}
		o.adds = append(o.adds, a)
	}
	for _, v := range []string{"/etc/istio/proxy", "/var/lib/istio/data:0750"} {
		d, err := parseDir(v)
		if err != nil {
			t.Fatal(err)
		}
		o.dirs = append(o.dirs, d)
	}
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	got, entrypoint, user := readImage(t, o.out, o.tag)
	want := map[string]tarEntry{
		"usr/":                      {typ: tar.TypeDir, mode: 0o755},
		"usr/local/":                {typ: tar.TypeDir, mode: 0o755},
		"usr/local/bin/":            {typ: tar.TypeDir, mode: 0o755},
		"usr/local/bin/pilot-agent": {typ: tar.TypeReg, mode: 0o755, data: "agent-binary"},
		"usr/local/bin/envoy":       {typ: tar.TypeReg, mode: 0o755, data: "envoy-binary"},
		"var/":                      {typ: tar.TypeDir, mode: 0o755},
		"var/lib/":                  {typ: tar.TypeDir, mode: 0o755},
		"var/lib/istio/":            {typ: tar.TypeDir, mode: 0o755},
		"var/lib/istio/envoy/":      {typ: tar.TypeDir, mode: 0o755},
		"var/lib/istio/data/":       {typ: tar.TypeDir, mode: 0o750, uid: 1337, gid: 1337},
		"etc/":                      {typ: tar.TypeDir, mode: 0o755},
		"etc/istio/":                {typ: tar.TypeDir, mode: 0o755},
		"etc/istio/proxy/":          {typ: tar.TypeDir, mode: 0o755, uid: 1337, gid: 1337},
		"var/lib/istio/envoy/envoy_bootstrap_tmpl.json": {typ: tar.TypeReg, mode: 0o644, data: `{"admin":{}}`},
	}
	for n, w := range want {
		if g, ok := got[n]; !ok {
			t.Errorf("%s missing from the layer", n)
		} else if g != w {
			t.Errorf("%s: got %+v, want %+v", n, g, w)
		}
	}
	for n := range got {
		if _, ok := want[n]; !ok {
			t.Errorf("unexpected %s in the layer", n)
		}
	}
	if len(entrypoint) != 1 || entrypoint[0] != "/usr/local/bin/pilot-agent" || user != "1337:1337" {
		t.Errorf("entry point %q user %q", entrypoint, user)
	}
}

func TestBuildWithoutExtrasIsTheBinaryAlone(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "meshagent")
	if err := os.WriteFile(bin, []byte("agent"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := options{binary: bin, target: "/usr/local/bin/meshagent", tag: "meshagent/meshagent:0.1.0", user: "65532:65532", arch: "amd64", out: filepath.Join(dir, "a.tar")}
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	got, entrypoint, user := readImage(t, o.out, o.tag)
	if len(got) != 4 || got["usr/local/bin/meshagent"].data != "agent" || got["usr/local/bin/meshagent"].mode != 0o755 {
		t.Errorf("layer %+v, want usr/, usr/local/, usr/local/bin/ and the binary", got)
	}
	if entrypoint[0] != o.target || user != o.user {
		t.Errorf("entry point %q user %q", entrypoint, user)
	}
}

func TestBadSpecsAreRefused(t *testing.T) {
	for _, tt := range []struct {
		name, add, dir, want string
	}{
		{name: "add without destination", add: "envoy", want: "want src:dst"},
		{name: "add relative destination", add: "envoy:usr/bin/envoy", want: "clean absolute path"},
		{name: "add unclean destination", add: "envoy:/usr/../bin/envoy", want: "clean absolute path"},
		{name: "add bad mode", add: "envoy:/usr/bin/envoy:rwx", want: "octal"},
		{name: "add too many parts", add: "a:/b:0644:x", want: "want src:dst"},
		{name: "dir relative", dir: "etc/istio", want: "clean absolute path"},
		{name: "dir root", dir: "/", want: "clean absolute path"},
		{name: "dir bad mode", dir: "/etc/istio:999", want: "octal"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.add != "" {
				_, err = parseAdd(tt.add)
			} else {
				_, err = parseDir(tt.dir)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestConflictingEntriesAreRefused(t *testing.T) {
	for _, tt := range []struct {
		name    string
		entries []entry
		want    string
	}{
		{name: "same path twice", entries: []entry{{name: "/usr/local/bin/envoy"}, {name: "/usr/local/bin/envoy"}}, want: "named twice"},
		{name: "file under a file", entries: []entry{{name: "/usr/local/bin/envoy"}, {name: "/usr/local/bin/envoy/x"}}, want: "is a file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := layerOf(tt.entries); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
	if _, _, err := parseUser("nobody"); err == nil {
		t.Fatal("-user nobody accepted, want numeric uid:gid")
	}
}

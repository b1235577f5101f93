// Command image writes a container image of one static binary: a single layer holding
// the binary, run as a non-root user with the binary as its entry point, nothing else
// (no shell, no libc, no package manager) but the extra files (-add) and empty
// directories (-dir) asked for. It needs no container daemon: the image is
// assembled in memory with go-containerregistry and written as an archive (the format of
// `docker save`, which `ctr images import`, `kind load image-archive` and `docker load`
// accept) or pushed to a registry.
//
// `make image` runs it on bin/meshagent; the end-to-end tests run it on their own
// programs (the pause container, the test client).
//
// Usage:
//
//	image -binary bin/meshagent -tag meshagent/meshagent:0.1.0 -o bin/meshagent-image.tar
//	image -binary bin/meshagent -tag registry.example/meshagent:0.1.0 -push
//
// An image with more than the entry point (Istio's proxy image: pilot-agent, an Envoy and
// Envoy's bootstrap template; see test/pilotagent):
//
//	image -binary pilot-agent -path /usr/local/bin/pilot-agent -user 1337:1337 \
//	    -add envoy:/usr/local/bin/envoy \
//	    -add envoy_bootstrap.json:/var/lib/istio/envoy/envoy_bootstrap_tmpl.json:0644 \
//	    -dir /etc/istio/proxy -tag example/proxyv2:dev -o proxyv2.tar
//
// -add's mode is octal and defaults to 0755; added files are owned by root. -dir's
// directories are owned by -user (so the container can write there) with mode 0755
// unless one is given.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type options struct {
	binary string // the static binary to put in the image
	target string // where it lives in the image
	tag    string // image reference, e.g. meshagent/meshagent:0.1.0
	out    string // archive to write
	push   bool   // push to the registry named by tag instead of writing out
	user   string // uid:gid the image runs as
	arch   string // GOARCH the binary was built for
	adds   []addSpec
	dirs   []dirSpec
}

// addSpec is one -add: a file of the host copied into the image.
type addSpec struct {
	src, dst string
	mode     int64
}

// dirSpec is one -dir: an empty directory owned by the image's user.
type dirSpec struct {
	dst  string
	mode int64
}

// parseAdd parses "src:dst[:mode]".
func parseAdd(v string) (addSpec, error) {
	parts := strings.Split(v, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" {
		return addSpec{}, fmt.Errorf("-add %q: want src:dst[:mode]", v)
	}
	a := addSpec{src: parts[0], dst: parts[1], mode: 0o755}
	if err := checkImagePath(parts[1]); err != nil {
		return addSpec{}, fmt.Errorf("-add %q: %w", v, err)
	}
	if len(parts) == 3 {
		m, err := parseMode(parts[2])
		if err != nil {
			return addSpec{}, fmt.Errorf("-add %q: %w", v, err)
		}
		a.mode = m
	}
	return a, nil
}

// parseDir parses "dst[:mode]".
func parseDir(v string) (dirSpec, error) {
	parts := strings.Split(v, ":")
	if len(parts) > 2 {
		return dirSpec{}, fmt.Errorf("-dir %q: want path[:mode]", v)
	}
	d := dirSpec{dst: parts[0], mode: 0o755}
	if err := checkImagePath(parts[0]); err != nil {
		return dirSpec{}, fmt.Errorf("-dir %q: %w", v, err)
	}
	if len(parts) == 2 {
		m, err := parseMode(parts[1])
		if err != nil {
			return dirSpec{}, fmt.Errorf("-dir %q: %w", v, err)
		}
		d.mode = m
	}
	return d, nil
}

func parseMode(s string) (int64, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("mode %q: want octal permission bits such as 0644", s)
	}
	return int64(m), nil
}

func checkImagePath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return fmt.Errorf("%q: want a clean absolute path", p)
	}
	return nil
}

// repeated is a flag that may be given many times.
type repeated func(string) error

func (r repeated) String() string     { return "" }
func (r repeated) Set(v string) error { return r(v) }

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "bin/meshagent", "static binary to put in the image")
	flag.StringVar(&o.target, "path", "/usr/local/bin/meshagent", "absolute path of the binary in the image; it is the entry point")
	flag.StringVar(&o.tag, "tag", "", "image reference (repository:tag)")
	flag.StringVar(&o.out, "o", "bin/meshagent-image.tar", "archive to write (docker-save format)")
	flag.BoolVar(&o.push, "push", false, "push the image to the registry of -tag (credentials from ~/.docker/config.json) instead of writing -o")
	flag.StringVar(&o.user, "user", "65532:65532", "numeric uid:gid the container runs as")
	flag.StringVar(&o.arch, "arch", "amd64", "architecture of the binary (GOARCH)")
	flag.Var(repeated(func(v string) error {
		a, err := parseAdd(v)
		o.adds = append(o.adds, a)
		return err
	}), "add", "src:dst[:mode]: also put file src at dst in the image (octal mode, default 0755, owned by root); repeatable")
	flag.Var(repeated(func(v string) error {
		d, err := parseDir(v)
		o.dirs = append(o.dirs, d)
		return err
	}), "dir", "path[:mode]: an empty directory owned by -user (default mode 0755); repeatable")
	flag.Parse()
	if err := build(o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// entriesOf reads the image's files: the entry point, every -add and every
// -dir (owned by uid and gid).
func entriesOf(o options, uid, gid int) ([]entry, error) {
	bin, err := os.ReadFile(o.binary)
	if err != nil {
		return nil, err
	}
	entries := []entry{{name: o.target, mode: 0o755, data: bin}}
	for _, a := range o.adds {
		data, err := os.ReadFile(a.src)
		if err != nil {
			return nil, fmt.Errorf("-add: %w", err)
		}
		entries = append(entries, entry{name: a.dst, mode: a.mode, data: data})
	}
	for _, d := range o.dirs {
		entries = append(entries, entry{name: d.dst, mode: d.mode, dir: true, uid: uid, gid: gid})
	}
	return entries, nil
}

func build(o options) error {
	if o.tag == "" {
		return errors.New("-tag is required")
	}
	if err := checkImagePath(o.target); err != nil {
		return fmt.Errorf("-path %w", err)
	}
	uid, gid, err := parseUser(o.user)
	if err != nil {
		return err
	}
	ref, err := name.NewTag(o.tag)
	if err != nil {
		return fmt.Errorf("-tag: %w", err)
	}
	entries, err := entriesOf(o, uid, gid)
	if err != nil {
		return err
	}
	layerTar, err := layerOf(entries)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = o.arch
	cfg.Config.Entrypoint = []string{o.target}
	cfg.Config.User = o.user
	cfg.Config.WorkingDir = "/"
	cfg.Config.Env = []string{"PATH=/usr/local/bin"}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return err
	}
	// The same binary gives the same image digest.
	img, err = mutate.CreatedAt(img, v1.Time{Time: time.Unix(0, 0).UTC()})
	if err != nil {
		return err
	}
	if o.push {
		if err := remote.Write(ref, img, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("pushing %s: %w", ref, err)
		}
		fmt.Println("pushed", ref.String())
		return nil
	}
	tmp := o.out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", o.out, err)
	}
	if err := os.Rename(tmp, o.out); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s: %s %s\n", o.out, ref.String(), digest)
	return nil
}

// parseUser parses -user's numeric "uid:gid".
func parseUser(v string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(v, ":")
	if ok {
		uid, err = strconv.Atoi(u)
		if err == nil {
			gid, err = strconv.Atoi(g)
		}
	}
	if !ok || err != nil || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("-user %q: want numeric uid:gid", v)
	}
	return uid, gid, nil
}

// entry is one file or directory of the layer.
type entry struct {
	name     string // clean absolute path
	mode     int64
	data     []byte
	dir      bool
	uid, gid int
}

// layerOf returns a tar of entries with their parent directories (mode 0755, owned by
// root), in path order, every time stamp at the epoch. A path named twice, or a file
// where another entry needs a directory, is an error.
func layerOf(entries []entry) ([]byte, error) {
	byName := map[string]entry{}
	for _, e := range entries {
		if _, dup := byName[e.name]; dup {
			return nil, fmt.Errorf("%s is named twice", e.name)
		}
		byName[e.name] = e
	}
	for _, e := range entries {
		for dir := path.Dir(e.name); dir != "/"; dir = path.Dir(dir) {
			if p, ok := byName[dir]; ok {
				if !p.dir {
					return nil, fmt.Errorf("%s is a file, but %s is under it", dir, e.name)
				}
				continue
			}
			byName[dir] = entry{name: dir, mode: 0o755, dir: true}
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, n := range names {
		e := byName[n]
		hdr := &tar.Header{Name: strings.TrimPrefix(n, "/"), Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: epoch, Format: tar.FormatPAX}
		if e.dir {
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		} else {
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Command image writes a container image of one static binary: a single layer holding
// the binary, run as a non-root user with the binary as its entry point, nothing else
// (no shell, no libc, no package manager). It needs no container daemon: the image is
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
}

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "bin/meshagent", "static binary to put in the image")
	flag.StringVar(&o.target, "path", "/usr/local/bin/meshagent", "absolute path of the binary in the image; it is the entry point")
	flag.StringVar(&o.tag, "tag", "", "image reference (repository:tag)")
	flag.StringVar(&o.out, "o", "bin/meshagent-image.tar", "archive to write (docker-save format)")
	flag.BoolVar(&o.push, "push", false, "push the image to the registry of -tag (credentials from ~/.docker/config.json) instead of writing -o")
	flag.StringVar(&o.user, "user", "65532:65532", "numeric uid:gid the container runs as")
	flag.StringVar(&o.arch, "arch", "amd64", "architecture of the binary (GOARCH)")
	flag.Parse()
	if err := build(o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func build(o options) error {
	if o.tag == "" {
		return errors.New("-tag is required")
	}
	if !path.IsAbs(o.target) || path.Clean(o.target) != o.target {
		return fmt.Errorf("-path %q: want a clean absolute path", o.target)
	}
	ref, err := name.NewTag(o.tag)
	if err != nil {
		return fmt.Errorf("-tag: %w", err)
	}
	bin, err := os.ReadFile(o.binary)
	if err != nil {
		return err
	}
	layerTar, err := layerOf(o.target, bin)
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

// layerOf returns a tar holding bin at target (mode 0755, owned by root), with its
// parent directories, every time stamp at the epoch.
func layerOf(target string, bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dir := ""
	for _, part := range strings.Split(strings.TrimPrefix(path.Dir(target), "/"), "/") {
		if part == "" {
			continue
		}
		dir += part + "/"
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(target, "/"), Mode: 0o755, Size: int64(len(bin)), ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

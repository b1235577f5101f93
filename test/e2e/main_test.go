//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/test/e2e/cluster"
	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/pilotagent"
)

const (
	clientImage  = "meshagent.test/e2e-client:e2e"
	xdsechoImage = "meshagent.test/xdsecho:e2e"
	agentImage   = "meshagent/meshagent" // tag: the chart's appVersion, as `make image` builds it
)

var kube *cluster.Cluster

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	root := repoRoot()
	agentTar := filepath.Join(root, "bin", "meshagent-image.tar")
	if _, err := os.Stat(agentTar); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: bin/meshagent-image.tar missing: run make image (make e2e does)")
		return 1
	}
	dir, err := os.MkdirTemp("", "meshagent-e2e-images-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	images := []string{agentTar}
	for _, img := range []struct{ pkg, tag, path string }{
		{"./test/e2e/images/pause", cluster.PauseImage, "/pause"},
		{"./test/e2e/images/client", clientImage, "/usr/local/bin/client"},
		{"./test/e2e/images/mtls", mtlsImage, "/usr/local/bin/mtls"},
		{"./test/e2e/images/xdsecho", xdsechoImage, "/usr/local/bin/xdsecho"},
	} {
		tar, err := buildImage(root, dir, img.pkg, img.tag, img.path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		images = append(images, tar)
	}
	proxyTar, err := buildProxyImage(root, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	images = append(images, proxyTar)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	start := time.Now()
	kube, err = cluster.Start(ctx, cluster.Config{Images: images, Logf: func(f string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s "+f+"\n", append([]any{time.Now().Format("15:04:05.000")}, a...)...)
	}})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: cluster up in %.1fs (work directory %s)\n", time.Since(start).Seconds(), kube.Dir())
	// Teardown runs on every way out: tests done, a failure, or an interrupt.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		fmt.Fprintln(os.Stderr, "e2e: interrupted, tearing down")
		_ = stopControlPlane()
		if err := kube.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: teardown:", err)
		}
		os.Exit(1)
	}()
	code := m.Run()
	if code != 0 {
		// Keep the components' logs where the reader can find them.
		keep := filepath.Join(os.TempDir(), fmt.Sprintf("meshagent-e2e-logs-%d", time.Now().Unix()))
		if err := exec.Command("cp", "-r", filepath.Join(kube.Dir(), "logs"), keep).Run(); err == nil {
			fmt.Fprintln(os.Stderr, "e2e: component logs kept in", keep)
		}
	}
	if err := stopControlPlane(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stopping istiod:", err)
		code = 1
	}
	stop := time.Now()
	if err := kube.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: teardown:", err)
		code = 1
	}
	fmt.Fprintf(os.Stderr, "e2e: teardown in %.1fs\n", time.Since(stop).Seconds())
	if left := kube.Leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "e2e: teardown left %s\n", strings.Join(left, ", "))
		code = 1
	}
	return code
}

// buildProxyImage writes the istio-proxy image istiod's injector names
// (proxyImage): the real pilot-agent of the pinned Istio module with the
// Envoy stand-in (test/e2e/images/envoy) and Envoy's bootstrap template, laid
// out as Istio's proxyv2 image (test/pilotagent).
func buildProxyImage(root, dir string) (string, error) {
	agent, err := kubeenv.ToolPath("pilot-agent")
	if err != nil {
		return "", err
	}
	tmpl, err := pilotagent.BootstrapTemplate()
	if err != nil {
		return "", err
	}
	envoy := filepath.Join(dir, "envoy")
	if err := pilotagent.BuildStandIn(envoy); err != nil {
		return "", err
	}
	tar := filepath.Join(dir, "proxyv2.tar")
	img := exec.Command(filepath.Join(root, "bin", "image-tool"), pilotagent.ProxyImageArgs(agent, envoy, tmpl, proxyImage, tar)...)
	if out, err := img.CombinedOutput(); err != nil {
		return "", fmt.Errorf("the istio-proxy image: %w\n%s", err, out)
	}
	return tar, nil
}

// buildImage builds a static binary of pkg and writes a one-layer image of it with
// tools/image (the tool of `make image`).
func buildImage(root, dir, pkg, tag, path string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	build := exec.Command("go", "build", "-o", bin, pkg)
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", pkg, err, out)
	}
	tar := bin + ".tar"
	img := exec.Command(filepath.Join(root, "bin", "image-tool"), "-binary", bin, "-path", path, "-tag", tag, "-o", tar)
	if out, err := img.CombinedOutput(); err != nil {
		return "", fmt.Errorf("image of %s: %w\n%s", pkg, err, out)
	}
	return tar, nil
}

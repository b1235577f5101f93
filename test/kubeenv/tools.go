package kubeenv

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
)

// ToolsDirEnv names the environment variable that overrides the tools directory, as it
// does for scripts/tools.sh.
const ToolsDirEnv = "MESHAGENT_TOOLS_DIR"

// keyFiles are the files whose content names the pinned tool versions, in the order
// scripts/tools.sh hashes them. Both must agree: TestToolsDirMatchesScript checks it.
var keyFiles = []string{
	"test/tools/go.mod",
	"test/tools/go.sum",
	"test/tools/helm/go.mod",
	"test/tools/helm/go.sum",
	"test/tools/spiffe-helper/go.mod",
	"test/tools/spiffe-helper/go.sum",
	"test/tools/istio/go.mod",
	"test/tools/istio/go.sum",
}

// ToolPath returns the path of a tool built by scripts/tools.sh: "etcd",
// "kube-apiserver", "helm" or "spiffe-helper", and with scripts/tools.sh -node
// "kubelet", "kube-controller-manager", "kube-scheduler" or "kubectl". A tool that is not there is an error
// telling the reader to run `make tools`.
func ToolPath(name string) (string, error) {
	dir, err := ToolsDir()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("test tool %s is not built (looked for %s): run make tools", name, path)
	}
	if err != nil {
		return "", fmt.Errorf("test tool %s: %w (run make tools)", name, err)
	}
	if info.IsDir() || info.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("test tool %s at %s is not an executable file: run make tools", name, path)
	}
	return path, nil
}

// ToolsDir returns the directory scripts/tools.sh builds into: $MESHAGENT_TOOLS_DIR
// when set (relative to the repository root if relative), else $HOME/.cache/meshagent/tools/<key>, where key is the first 16 hex
// digits of the SHA-256 of the files in keyFiles, concatenated.
func ToolsDir() (string, error) {
	dir := os.Getenv(ToolsDirEnv)
	if filepath.IsAbs(dir) {
		return dir, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	if dir != "" {
		// Relative to the repository root, as for scripts/tools.sh.
		return filepath.Join(root, dir), nil
	}
	h := sha256.New()
	for _, name := range keyFiles {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			return "", fmt.Errorf("computing the test tools directory: %w", err)
		}
		h.Write(b)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("computing the test tools directory: %w (or set %s)", err, ToolsDirEnv)
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	return filepath.Join(home, ".cache", "meshagent", "tools", key), nil
}

// repoRoot finds the repository root: the nearest directory above the working
// directory, else above this source file, that holds test/tools/go.mod.
func repoRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			if _, err := os.Stat(filepath.Join(dir, "test", "tools", "go.mod")); err == nil {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("test/tools/go.mod not found above %v: set %s to the directory make tools built into", starts, ToolsDirEnv)
}

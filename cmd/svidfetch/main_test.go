package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/test/agentproc"
)

// TestFetchesFromTheDevAgent is the README's "try it" step: the agent as
// `make run` starts it (--dev), and svidfetch against its socket.
func TestFetchesFromTheDevAgent(t *testing.T) {
	dir := agentproc.TempDir(t)
	agentproc.Start(t, dir, "MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1")
	out := filepath.Join(t.TempDir(), "svid")
	if err := run(filepath.Join(dir, agentproc.SDSSocket), out, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"svid.pem", "svid.key", "bundle.pem"} {
		b, err := os.ReadFile(filepath.Join(out, f))
		if err != nil || !strings.Contains(string(b), "-----BEGIN") {
			t.Errorf("%s: %v %q", f, err, b)
		}
	}
}

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
	// A link someone left at the key's name is replaced, never written
	// through: the file it points to keeps its content.
	if err := os.Mkdir(out, 0o700); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(out, "svid.key")); err != nil {
		t.Fatal(err)
	}
	if err := run(filepath.Join(dir, agentproc.SDSSocket), out, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"svid.pem", "svid.key", "bundle.pem"} {
		b, err := os.ReadFile(filepath.Join(out, f))
		if err != nil || !strings.Contains(string(b), "-----BEGIN") {
			t.Errorf("%s: %v %q", f, err, b)
		}
		if fi, err := os.Lstat(filepath.Join(out, f)); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v (%v), want a regular file 0600", f, fi.Mode(), err)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "mine" {
		t.Errorf("the key was written through the link: the victim holds %q", b)
	}
}

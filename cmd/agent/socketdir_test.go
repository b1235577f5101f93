package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestSocketDirGivesTheDirectoryToTheAgent(t *testing.T) {
	parent := t.TempDir()
	made := filepath.Join(parent, "new")
	existing := filepath.Join(parent, "existing")
	if err := os.Mkdir(existing, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{made, existing} {
		var stderr bytes.Buffer
		if code := execute(context.Background(), []string{"socket-dir", "--owner", "4711:4712", dir}, nil, &stderr, &stderr, hooks{}); code != exitOK {
			t.Fatalf("socket-dir %s: exit %d: %s", dir, code, stderr.String())
		}
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 4711 || st.Gid != 4712 || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: owner %d:%d mode %v, want 4711:4712 0755", dir, st.Uid, st.Gid, fi.Mode().Perm())
		}
	}

	link := filepath.Join(parent, "link")
	if err := os.Symlink(existing, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(parent, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		code int
	}{
		{[]string{"socket-dir", "--owner", "4711:4712", link}, exitFailure},
		{[]string{"socket-dir", "--owner", "4711:4712", file}, exitFailure},
		{[]string{"socket-dir", "--owner", "agent", existing}, exitConfig},
		{[]string{"socket-dir", "--owner", "-1:0", existing}, exitConfig},
	} {
		var out bytes.Buffer
		if code := execute(context.Background(), tt.args, nil, &out, &out, hooks{}); code != tt.code {
			t.Errorf("%v: exit %d, want %d: %s", tt.args, code, tt.code, out.String())
		}
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode().Type() != os.ModeSymlink {
		t.Errorf("the symbolic link was followed or replaced: %v, %v", fi, err)
	}
}

// TestSocketDirPrivateDirs: --private-dir may be given more than once (the
// pods' token directory and the socket holder's); each is made 0700 and the
// agent's.
func TestSocketDirPrivateDirs(t *testing.T) {
	parent := t.TempDir()
	sock, tokens, handoff := filepath.Join(parent, "sock"), filepath.Join(parent, "tokens"), filepath.Join(parent, "handoff")
	var stderr bytes.Buffer
	args := []string{"socket-dir", "--owner", "4711:4712", "--private-dir=" + tokens, "--private-dir=" + handoff, sock}
	if code := execute(context.Background(), args, nil, &stderr, &stderr, hooks{}); code != exitOK {
		t.Fatalf("%v: exit %d: %s", args, code, stderr.String())
	}
	for dir, mode := range map[string]os.FileMode{sock: 0o755, tokens: 0o700, handoff: 0o700} {
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 4711 || st.Gid != 4712 || fi.Mode().Perm() != mode {
			t.Errorf("%s: owner %d:%d mode %v, want 4711:4712 %v", dir, st.Uid, st.Gid, fi.Mode().Perm(), mode)
		}
	}
}

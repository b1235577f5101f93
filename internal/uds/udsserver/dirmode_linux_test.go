package udsserver

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// childWhoEnv makes the test binary a child that calls the who service on
// the socket it names once and prints the answer, or "error: ...".
const childWhoEnv = "UDSSERVER_TEST_WHO"

func childWho(path string) int {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println("error:", err)
		return 0
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out wrapperspb.StringValue
	if err := conn.Invoke(ctx, whoUnary, wrapperspb.String("who"), &out); err != nil {
		fmt.Println("error:", err)
		return 0
	}
	fmt.Println(out.GetValue())
	return 0
}

// TestSocketDirModeLetsOtherUIDsIn: in node mode the socket directory is a
// host directory mounted into pods whose processes run as other uids (Envoy
// as 1337). With the default 0750 directory such a process cannot reach the
// socket; with DirMode 0755 (node mode) it can, and is identified by the
// kernel like any other. An existing directory keeps its mode.
func TestSocketDirModeLetsOtherUIDsIn(t *testing.T) {
	const uid = 1337
	top := shortDir(t)
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	// A copy of the test binary a process of uid 1337 can run.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(top, "child")
	copyFile(t, self, bin)

	who := func(socket string) string {
		t.Helper()
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), childWhoEnv+"="+socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child as uid %d: %v", uid, err)
		}
		return strings.TrimSpace(string(out))
	}
	serve := func(socket string, mode os.FileMode) {
		t.Helper()
		srv, err := New(Config{SocketPath: socket, Services: []func(*grpc.Server){registerWho}, DirMode: mode, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
		f := &fixture{t: t, socket: socket}
		if _, err := unary(t, f.dial()); err != nil { // the socket is up
			t.Fatal(err)
		}
	}

	sidecar := filepath.Join(top, "sidecar", "socket")
	serve(sidecar, 0)
	if got := who(sidecar); !strings.Contains(got, "permission denied") {
		t.Fatalf("uid %d through a 0750 directory: %q, want permission denied", uid, got)
	}

	// A directory the server makes gets DirMode.
	node := filepath.Join(top, "node", "socket")
	serve(node, 0o755)
	if fi, err := os.Stat(filepath.Dir(node)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("node socket directory: %v, %v; want 0755", fi.Mode(), err)
	}
	if got := who(node); !strings.HasPrefix(got, fmt.Sprintf("uid=%d gid=%d ", uid, uid)) {
		t.Fatalf("uid %d through a 0755 directory: %q, want served with its own credentials", uid, got)
	}

	// An existing directory is never changed (one set to /tmp keeps its
	// sticky bit; one its owner closed stays closed).
	kept := filepath.Join(top, "kept", "socket")
	if err := os.Mkdir(filepath.Dir(kept), 0o700); err != nil {
		t.Fatal(err)
	}
	serve(kept, 0o755)
	if fi, err := os.Stat(filepath.Dir(kept)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("existing socket directory: %v, %v; want it left 0700", fi.Mode(), err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

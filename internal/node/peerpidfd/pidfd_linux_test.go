package peerpidfd

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

const childConnectEnv = "PEERPIDFD_TEST_CONNECT"

func TestMain(m *testing.M) {
	if path := os.Getenv(childConnectEnv); path != "" {
		conn, err := net.Dial("unix", path)
		if err != nil {
			os.Exit(2)
		}
		_, _ = io.Copy(io.Discard, os.Stdin)
		conn.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestFromConnNamesTheConnectingProcess: the pidfd names the child that
// connected while it lives, and nobody once it has exited and been reaped.
func TestFromConnNamesTheConnectingProcess(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childConnectEnv+"="+sock)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fd, err := FromConn(conn.(*net.UnixConn))
	if err != nil {
		t.Fatalf("FromConn: %v", err)
	}
	defer unix.Close(fd)
	if pid, err := PID(fd); err != nil || pid != child.Process.Pid {
		t.Fatalf("PID = %d, %v; want the child's %d", pid, err, child.Process.Pid)
	}
	stdin.Close()
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
	if pid, err := PID(fd); err != nil || pid != -1 {
		t.Fatalf("PID after the child exited = %d, %v; want -1", pid, err)
	}
	if err := unix.PidfdSendSignal(fd, 0, nil, 0); err != unix.ESRCH {
		t.Fatalf("signalling the exited child: %v, want ESRCH", err)
	}
}

func TestPIDOfANonPidfd(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := PID(int(f.Fd())); err == nil {
		t.Fatal("PID of /dev/null succeeded")
	}
}

func TestContext(t *testing.T) {
	if _, ok := FromContext(context.Background()); ok {
		t.Fatal("empty context carries a pidfd")
	}
	if fd, ok := FromContext(NewContext(context.Background(), 7)); !ok || fd != 7 {
		t.Fatalf("FromContext = %d, %v", fd, ok)
	}
	if _, ok := FromContext(NewContext(context.Background(), -1)); ok {
		t.Fatal("a negative fd is carried")
	}
}

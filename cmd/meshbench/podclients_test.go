package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPodClientConnectsFromThePodsCgroup builds podclient, starts it in a
// pod's cgroup and checks that the connection meshbench receives is the one
// the process made from there: the listener's SO_PEERCRED pid is the
// process, and its /proc cgroup names the pod.
func TestPodClientConnectsFromThePodsCgroup(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "podclient")
	if out, err := exec.Command("go", "build", "-o", bin, "./podclient").CombinedOutput(); err != nil {
		t.Fatalf("building podclient: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "s")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	const uid = "0b9e8a5c-1111-4222-8333-944455556666"
	p, err := startPodClient(bin, sock, uid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctl := p.ctl
	if _, err := ctl.Write([]byte{'g'}); err != nil {
		t.Fatal(err)
	}
	type accepted struct {
		c   net.Conn
		err error
	}
	got := make(chan accepted, 1)
	go func() {
		c, err := lis.Accept()
		got <- accepted{c, err}
	}()
	theirs, err := receiveConn(ctl)
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Close()
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	defer a.c.Close()
	raw, err := a.c.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cred *unix.Ucred
	var cerr error
	_ = raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil {
		t.Fatal(cerr)
	}
	if int(cred.Pid) != p.proc.Process.Pid {
		t.Errorf("peer pid %d, want podclient's %d", cred.Pid, p.proc.Process.Pid)
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cred.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cg), "/kubepods/besteffort/pod"+uid+"/") {
		t.Errorf("peer's cgroups do not name the pod:\n%s", cg)
	}
	// The handed-over connection is the accepted one's other end.
	_ = a.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := theirs.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := a.c.Read(buf); err != nil || string(buf) != "ping" {
		t.Errorf("read %q, %v through the handed-over connection", buf, err)
	}
}

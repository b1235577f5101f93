package podresolver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/meshagent/meshagent/internal/node/peerpidfd"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/test/podproc"
)

// TestRealProcesses resolves real processes placed in pod cgroups, in both
// path shapes, through the real /proc with pidfds.
func TestRealProcesses(t *testing.T) {
	r, err := New(Config{Pods: podMap{
		uidA: pod("shop", "cart-0", uidA, "cart", corev1.PodRunning),
		uidB: pod("shop", "pay-0", uidB, "payments", corev1.PodRunning),
	}})
	if err != nil {
		t.Fatal(err)
	}
	a := podproc.Start(t, podproc.Cgroupfs, uidA, cid)
	b := podproc.Start(t, podproc.Systemd, uidB, cid)
	for _, tt := range []struct {
		cmd  *exec.Cmd
		want string
	}{{a, "spiffe://cluster.local/ns/shop/sa/cart"}, {b, "spiffe://cluster.local/ns/shop/sa/payments"}} {
		info, err := r.Resolve(context.Background(), caller.Cred{PID: int32(tt.cmd.Process.Pid)})
		if err != nil {
			t.Fatalf("Resolve(pid %d): %v", tt.cmd.Process.Pid, err)
		}
		if info.Identity.String() != tt.want {
			t.Fatalf("pid %d resolved to %q, want %q", tt.cmd.Process.Pid, info.Identity, tt.want)
		}
	}

	// A dead process is refused (its pid is free, not reused).
	podproc.Kill(a)
	_, err = r.Resolve(context.Background(), caller.Cred{PID: int32(a.Process.Pid)})
	wantRefusal(t, err, ReasonProcessGone)

	// This test process is a node process: refused without a uid identity.
	_, err = r.Resolve(context.Background(), caller.Cred{PID: int32(os.Getpid())})
	wantRefusal(t, err, ReasonNodeProcess)
}

// TestRealPIDReuse: a process of the attacker's pod connects, exits, and its
// pid is given to a process of the victim's pod, both pods on the node as the
// API server has them. With the connection's pidfd (SO_PEERPIDFD, read at
// accept) the connection gets nothing.
func TestRealPIDReuse(t *testing.T) {
	kube := kube.Env(t)
	ctx0 := context.Background()
	ns := fmt.Sprintf("reuse-%d", time.Now().UnixNano())
	if _, err := kube.CreateNamespace(ctx0, ns); err != nil {
		t.Fatal(err)
	}
	var uids [2]string
	for i, name := range []string{"attacker", "vault"} {
		if _, err := kube.CreateServiceAccount(ctx0, ns, name); err != nil {
			t.Fatal(err)
		}
		p, err := kube.CreatePod(ctx0, ns, name+"-0", name, "node-reuse")
		if err != nil {
			t.Fatal(err)
		}
		uids[i] = string(p.UID)
	}
	uidAttacker, uidVictim := uids[0], uids[1]
	idx, err := podindex.New(podindex.Config{Pods: agentClient(t, kube), NodeName: "node-reuse", Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	runIndex(t, idx)
	r, err := New(Config{Pods: idx, PodWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	attacker := exec.Command(os.Args[0], "-test.run=^$")
	attacker.Env = append(os.Environ(), childConnectEnv+"="+sock)
	stdin, err := attacker.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := attacker.Start(); err != nil {
		t.Fatal(err)
	}
	podproc.Move(t, attacker.Process.Pid, podproc.Cgroupfs, uidAttacker, cid)
	t.Cleanup(func() { podproc.Kill(attacker) }) // before Move's cleanup: cleanups run last first
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	uc := conn.(*net.UnixConn)
	cred := peerCred(t, uc)
	if int(cred.PID) != attacker.Process.Pid {
		t.Fatalf("SO_PEERCRED pid %d, want the attacker's %d", cred.PID, attacker.Process.Pid)
	}
	pidfd, err := peerpidfd.FromConn(uc)
	if err != nil {
		t.Fatalf("peer pidfd: %v", err)
	}
	defer syscall.Close(pidfd)
	ctx := peerpidfd.NewContext(context.Background(), pidfd)

	info, err := r.Resolve(ctx, cred)
	if err != nil || info.Identity.String() != "spiffe://cluster.local/ns/"+ns+"/sa/attacker" {
		t.Fatalf("attacker resolved to %+v, %v; want its own identity", info, err)
	}

	// The attacker exits (the connection stays open on our side) and the
	// victim's process gets its pid.
	stdin.Close()
	if err := attacker.Wait(); err != nil {
		t.Fatalf("attacker: %v", err)
	}
	victim := podproc.StartWithPID(t, int(cred.PID))
	defer podproc.Kill(victim) // if Move fails
	podproc.Move(t, victim.Process.Pid, podproc.Cgroupfs, uidVictim, cid)
	t.Cleanup(func() { podproc.Kill(victim) })

	_, err = r.Resolve(ctx, cred)
	wantRefusal(t, err, ReasonProcessGone)

	// Without the connection's pidfd the reuse cannot be seen (the limit
	// doc.go states): the pid now really is the victim's.
	info, err = r.Resolve(context.Background(), cred)
	if err != nil || info.PodUID != uidVictim {
		t.Fatalf("pid %d resolved to %+v, %v; want the victim's pod (the pid was not reused?)", cred.PID, info, err)
	}
}

func peerCred(t *testing.T, c *net.UnixConn) caller.Cred {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var (
		u    *syscall.Ucred
		uerr error
	)
	if err := raw.Control(func(fd uintptr) {
		u, uerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || uerr != nil {
		t.Fatalf("SO_PEERCRED: %v %v", err, uerr)
	}
	return caller.Cred{UID: u.Uid, GID: u.Gid, PID: u.Pid}
}

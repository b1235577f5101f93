// Package podproc starts test processes inside cgroups shaped like a
// kubelet's pod cgroups, so that /proc/<pid>/cgroup of a real process names
// a pod, as on a node. FetchAsPod runs the test binary itself as such a
// process, fetching a certificate over SDS (RunFetchChild in TestMain).
//
// It owns the cgroup directories it creates (the pod's and the container's;
// the shared kubepods and QoS parents are left in place, since tests of other
// packages may be using them) and removes them after the test, once the
// process is dead. It needs root and writable cgroups: it uses the cgroup v1
// pids hierarchy and the cgroup v2 hierarchy, whichever are mounted (Roots).
// A test that cannot create them fails: it never skips.
package podproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Shape is how the cgroup path is spelled.
type Shape int

const (
	// Cgroupfs is the cgroupfs driver's /kubepods/besteffort/pod<uid>/<id>.
	Cgroupfs Shape = iota
	// Systemd is the systemd driver's
	// /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/cri-containerd-<id>.scope.
	Systemd
	// Delegated is the cgroupfs shape inside a delegated subtree, as a node
	// user given cgroup delegation (systemd's Delegate=, nspawn, LXD) can
	// make it: /machine.slice/meshagent-test-<uid>.scope/kubepods/besteffort/pod<uid>/<id>.
	// It names a pod, but outside the kubelet's cgroup root. Move removes
	// the whole subtree it made (machine.slice too, when it made it).
	Delegated
)

// Roots returns the writable cgroup hierarchies test processes are placed
// in: the cgroup v1 pids hierarchy and the cgroup v2 one (hybrid nodes mount
// it at /sys/fs/cgroup/unified), whichever are mounted. A node shows a
// container's path on every hierarchy; so do test processes.
func Roots() ([]string, error) {
	var roots []string
	for _, c := range []struct {
		dir   string
		magic int64
	}{
		{"/sys/fs/cgroup/pids", unix.CGROUP_SUPER_MAGIC},
		{"/sys/fs/cgroup/unified", unix.CGROUP2_SUPER_MAGIC},
		{"/sys/fs/cgroup", unix.CGROUP2_SUPER_MAGIC},
	} {
		var st unix.Statfs_t
		if err := unix.Statfs(c.dir, &st); err == nil && int64(st.Type) == c.magic {
			roots = append(roots, c.dir)
		}
	}
	if len(roots) == 0 {
		return nil, errors.New("no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids and no cgroup v2 at /sys/fs/cgroup/unified or /sys/fs/cgroup")
	}
	return roots, nil
}

// Dirs returns the pod and container directories of a pod's container, in
// the given shape, relative to the hierarchy root.
func Dirs(shape Shape, podUID, containerID string) (pod, container string) {
	if shape == Systemd {
		pod = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice"
		return pod, pod + "/cri-containerd-" + containerID + ".scope"
	}
	pod = "kubepods/besteffort/pod" + podUID
	if shape == Delegated {
		pod = delegatedScope(podUID) + "/" + pod
	}
	return pod, pod + "/" + containerID
}

// delegatedScope is the delegated subtree of the Delegated shape.
func delegatedScope(podUID string) string {
	return "machine.slice/meshagent-test-" + podUID + ".scope"
}

// removeDelegated removes, deepest first, the parents of a Delegated pod
// cgroup under root: those of the test's own scope, and machine.slice when
// it was not there before (madeSlice). A machine.slice another test still
// uses stays.
func removeDelegated(root, podUID string, madeSlice bool) error {
	scope := filepath.Join(root, delegatedScope(podUID))
	for _, dir := range []string{filepath.Join(scope, "kubepods/besteffort"), filepath.Join(scope, "kubepods"), scope} {
		if err := removeCgroup(dir); err != nil {
			return err
		}
	}
	if madeSlice {
		if err := removeCgroup(filepath.Dir(scope)); err != nil && !errors.Is(err, unix.ENOTEMPTY) {
			return err
		}
	}
	return nil
}

// Start starts `sleep` in the cgroup of container containerID of pod podUID.
// The test's cleanup kills it and removes the cgroups.
func Start(t testing.TB, shape Shape, podUID, containerID string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "3600")
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting a test process: %v", err)
	}
	moved := false
	defer func() {
		if !moved { // Move failed the test
			Kill(cmd)
		}
	}()
	Move(t, cmd.Process.Pid, shape, podUID, containerID)
	moved = true
	// Cleanups run last-registered first: the process dies before Move's
	// cleanup removes its cgroup.
	t.Cleanup(func() { Kill(cmd) })
	return cmd
}

// Kill kills and reaps a process started by Start; it is safe twice.
func Kill(cmd *exec.Cmd) {
	if cmd.ProcessState != nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// Move puts pid in the cgroup of container containerID of pod podUID. The
// test's cleanup removes the pod's cgroups, which must be empty by then:
// kill the process before, or in a cleanup registered after Move (cleanups
// run last-registered first).
func Move(t testing.TB, pid int, shape Shape, podUID, containerID string) {
	t.Helper()
	roots, err := Roots()
	if err != nil {
		t.Fatalf("cgroups for test pods (run as root on a machine with writable cgroups): %v", err)
	}
	podRel, ctrRel := Dirs(shape, podUID, containerID)
	for _, root := range roots {
		if shape == Delegated {
			// Registered first, so it runs after moveIn's cleanups.
			madeSlice := !exists(filepath.Join(root, "machine.slice"))
			t.Cleanup(func() {
				if err := removeDelegated(root, podUID, madeSlice); err != nil {
					t.Errorf("removing test cgroup: %v", err)
				}
			})
		}
		moveIn(t, pid, filepath.Join(root, podRel), filepath.Join(root, ctrRel))
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatalf("reading the cgroup of process %d: %v", pid, err)
	}
	if n := strings.Count(string(data), ":/"+ctrRel+"\n"); n != len(roots) {
		t.Fatalf("process %d is in %s on %d hierarchies, want %d (%v):\n%s", pid, ctrRel, n, len(roots), roots, data)
	}
}

func moveIn(t testing.TB, pid int, podDir, ctrDir string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(podDir), 0o755); err != nil {
		t.Fatalf("creating test cgroup parents (run as root): %v", err)
	}
	created := !exists(podDir)
	if err := os.MkdirAll(ctrDir, 0o755); err != nil {
		t.Fatalf("creating test cgroup (run as root): %v", err)
	}
	t.Cleanup(func() {
		if err := removeCgroup(ctrDir); err != nil {
			t.Errorf("removing test cgroup: %v", err)
		}
		if created {
			if err := removeCgroup(podDir); err != nil {
				t.Errorf("removing test cgroup: %v", err)
			}
		}
	})
	if err := os.WriteFile(filepath.Join(ctrDir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("moving process %d into %s: %v", pid, ctrDir, err)
	}
}

// removeCgroup removes an empty cgroup, retrying for a while when busy: a
// killed process leaves it shortly after it is reaped.
func removeCgroup(dir string) error {
	var err error
	for range 200 {
		err = os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// StartWithPID starts `sleep` with the given (free) pid, by setting the pid
// namespace's last allocated pid just below it, so that a test can hand a
// pid that just exited to another process (PID reuse). Other processes of
// the machine may take the pid first; it retries, boundedly. It needs root.
// The caller kills the process (Kill).
func StartWithPID(t testing.TB, pid int) *exec.Cmd {
	t.Helper()
	for range 500 {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0o644); err != nil {
			t.Fatalf("setting ns_last_pid (run as root): %v", err)
		}
		cmd := exec.Command("sleep", "3600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.Process.Pid == pid {
			return cmd
		}
		Kill(cmd)
	}
	t.Fatalf("could not start a process with pid %d", pid)
	return nil
}

// ContainerID returns the n-th container ID of the tests, in the shape a
// CRI runtime gives one (64 hexadecimal digits; podcgroup takes no other).
func ContainerID(n int) string { return fmt.Sprintf("c0ffee%058x", n) }

package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// inNetnsPath runs f on an OS thread switched into the network namespace at path. Sockets
// f makes stay in that namespace for their whole life, whatever thread uses them later.
func inNetnsPath(path string, f func() error) error {
	ns, err := os.Open(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: it dies with this goroutine, so a thread left
		// in the other namespace (if switching back failed) is never reused.
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering network namespace %s: %w", path, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// InNetnsOf runs f on an OS thread switched into the network namespace of
// the host process pid (a pod's processes share their pod's), as nsenter
// --net does: there the pod's 127.0.0.1 is reachable.
func InNetnsOf(pid int, f func() error) error {
	return inNetnsPath(fmt.Sprintf("/proc/%d/ns/net", pid), f)
}

// dialIn returns a dialer that opens its connections inside the network namespace.
func dialIn(path string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNetnsPath(path, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// kubeletSysctls are the kernel settings a kubelet sets at start.
var kubeletSysctls = []string{
	"vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
	"kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes",
}

func sysctlPath(name string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
}

func readSysctls() map[string]string {
	m := map[string]string{}
	for _, n := range kubeletSysctls {
		if b, err := os.ReadFile(sysctlPath(n)); err == nil {
			m[n] = strings.TrimSpace(string(b))
		}
	}
	return m
}

func restoreSysctls(saved map[string]string) error {
	var errs []error
	for n, v := range saved {
		b, err := os.ReadFile(sysctlPath(n))
		if err == nil && strings.TrimSpace(string(b)) == v {
			continue
		}
		if err := os.WriteFile(sysctlPath(n), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring %s=%s: %w", n, v, err))
		}
	}
	return errors.Join(errs...)
}

// cgroupHierarchies lists the mounted cgroup file systems (every v1 hierarchy and the
// v2 one).
func cgroupHierarchies() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, x := range fields {
			if x == "-" && i+1 < len(fields) && (fields[i+1] == "cgroup" || fields[i+1] == "cgroup2") {
				out = append(out, fields[4])
			}
		}
	}
	return out, sc.Err()
}

// makeCgroupRoot creates the kubelet's cgroup root in every hierarchy (the kubelet
// refuses a root that does not exist). cpuset children need cpus and mems before a
// process may join: they are copied from the parent.
func makeCgroupRoot(root string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		dir := filepath.Join(h, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
				}
			}
		}
	}
	return nil
}

// removeCgroupRoot kills whatever is left in the cgroup root (processes of pods this
// cluster ran) and removes it, deepest first, in every hierarchy.
func removeCgroupRoot(root string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		top := filepath.Join(h, root)
		var dirs []string
		filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			killCgroup(d)
			var err error
			for range 50 {
				if err = os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func killCgroup(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// mountsUnder lists the mount points at or under any of dirs, deepest first.
func mountsUnder(dirs ...string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescape(fields[4])
		for _, d := range dirs {
			if p == d || strings.HasPrefix(p, d+"/") {
				out = append(out, p)
				break
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, sc.Err()
}

func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder detaches every mount at or under dirs.
func unmountUnder(dirs ...string) error {
	var errs []error
	for range 5 {
		ms, err := mountsUnder(dirs...)
		if err != nil {
			return err
		}
		if len(ms) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, m := range ms {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
			}
		}
	}
	return errors.Join(errs...)
}

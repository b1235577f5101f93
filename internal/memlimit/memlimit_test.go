package memlimit

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
)

const (
	v2Mount = "30 22 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
	v1Mount = "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n" +
		"31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n" +
		"34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
	// A container's view: the memory hierarchy mounted from the pod's cgroup.
	v1MountNested = "34 30 0:31 /kubepods/pod1 /sys/fs/cgroup/memory ro,relatime - cgroup cgroup rw,memory\n"
)

const v2Controllers = "sys/fs/cgroup/cgroup.controllers"

func TestLimit(t *testing.T) {
	tests := []struct {
		name      string
		cgroup    string
		mountinfo string
		files     map[string]string // path under root: content
		limit     int64
		from      string
		err       error // errors.Is; nil with limit 0 means any error
	}{
		{"v2 limit", "0::/kubepods/pod1/c1\n", v2Mount,
			map[string]string{v2Controllers: "cpu memory pids\n", "sys/fs/cgroup/kubepods/pod1/c1/memory.max": "134217728\n", "sys/fs/cgroup/kubepods/pod1/memory.max": "max\n"},
			134217728, "/sys/fs/cgroup/kubepods/pod1/c1/memory.max", nil},
		{"v2 parent's limit is smaller", "0::/kubepods/pod1/c1\n", v2Mount,
			map[string]string{v2Controllers: "memory\n", "sys/fs/cgroup/kubepods/pod1/c1/memory.max": "max\n", "sys/fs/cgroup/kubepods/pod1/memory.max": "67108864\n"},
			67108864, "/sys/fs/cgroup/kubepods/pod1/memory.max", nil},
		{"v2 no limit", "0::/user.slice\n", v2Mount,
			map[string]string{v2Controllers: "memory\n", "sys/fs/cgroup/user.slice/memory.max": "max\n"}, 0, "", ErrNoLimit},
		{"v2 namespaced root", "0::/\n", v2Mount,
			map[string]string{v2Controllers: "memory\n", "sys/fs/cgroup/memory.max": "268435456\n"}, 268435456, "/sys/fs/cgroup/memory.max", nil},
		{"v1 limit", "9:pids:/x\n4:memory:/kubepods/burstable/pod1/c1\n1:name=systemd:/x\n", v1Mount,
			map[string]string{"sys/fs/cgroup/memory/kubepods/burstable/pod1/c1/memory.limit_in_bytes": "201326592\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"},
			201326592, "/sys/fs/cgroup/memory/kubepods/burstable/pod1/c1/memory.limit_in_bytes", nil},
		{"v1 huge means none", "4:memory:/x\n", v1Mount,
			map[string]string{"sys/fs/cgroup/memory/x/memory.limit_in_bytes": "9223372036854771712\n"}, 0, "", ErrNoLimit},
		{"v1 mounted from the pod's cgroup", "4:memory:/kubepods/pod1/c1\n", v1MountNested,
			map[string]string{"sys/fs/cgroup/memory/c1/memory.limit_in_bytes": "100663296\n"},
			100663296, "/sys/fs/cgroup/memory/c1/memory.limit_in_bytes", nil},
		{"hybrid: memory in v1", "0::/a\n4:memory:/a\n", v1Mount + "40 30 0:40 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
			map[string]string{"sys/fs/cgroup/unified/cgroup.controllers": "\n", "sys/fs/cgroup/memory/a/memory.limit_in_bytes": "1048576\n"},
			1048576, "/sys/fs/cgroup/memory/a/memory.limit_in_bytes", nil},
		{"no memory controller", "9:pids:/x\n", v1Mount, nil, 0, "", ErrNoLimit},
		{"garbage limit", "0::/a\n", v2Mount, map[string]string{v2Controllers: "memory\n", "sys/fs/cgroup/a/memory.max": "lots\n"}, 0, "", nil},
		{"garbage cgroup file", "memory\n", v2Mount, nil, 0, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			files := map[string]string{"proc/self/cgroup": tt.cgroup, "proc/self/mountinfo": tt.mountinfo}
			for p, c := range tt.files {
				files[p] = c
			}
			for p, c := range files {
				full := filepath.Join(root, p)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			limit, from, err := Limit(root)
			switch {
			case tt.limit > 0:
				if err != nil || limit != tt.limit || from != tt.from {
					t.Errorf("Limit = %d, %q, %v; want %d from %s", limit, from, err, tt.limit, tt.from)
				}
			case tt.err != nil:
				if !errors.Is(err, tt.err) {
					t.Errorf("Limit = %d, %v; want %v", limit, err, tt.err)
				}
			default:
				if err == nil || errors.Is(err, ErrNoLimit) {
					t.Errorf("Limit = %d, %v; want an error saying what is wrong", limit, err)
				}
			}
		})
	}
}

// writeTree writes files (path under root: content) under a new root.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestApplySetsNinetyPercent: with a limit in the cgroup files, v2 and v1
// alike, Apply gives the Go runtime 90 % of it and says where it read it.
func TestApplySetsNinetyPercent(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	for _, tt := range []struct {
		name  string
		files map[string]string
		limit int64
		from  string
	}{
		{"v2", map[string]string{"proc/self/cgroup": "0::/kubepods/pod1/c1\n", "proc/self/mountinfo": v2Mount, v2Controllers: "memory\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max": "134217728\n"}, 128 << 20, "/sys/fs/cgroup/kubepods/pod1/c1/memory.max"},
		{"v1", map[string]string{"proc/self/cgroup": "4:memory:/kubepods/pod1/c1\n", "proc/self/mountinfo": v1Mount,
			"sys/fs/cgroup/memory/kubepods/pod1/c1/memory.limit_in_bytes": "67108864\n"}, 64 << 20, "/sys/fs/cgroup/memory/kubepods/pod1/c1/memory.limit_in_bytes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := Apply(writeTree(t, tt.files), "")
			want := tt.limit * 9 / 10
			if d.Limit != tt.limit || d.Set != want || d.From != tt.from || d.Why != "" {
				t.Errorf("Apply = %+v, want limit %d, set %d, from %s", d, tt.limit, want, tt.from)
			}
			if got := debug.SetMemoryLimit(-1); got != want {
				t.Errorf("the runtime's soft limit is %d, want %d", got, want)
			}
		})
	}
}

func TestApplyLeavesGOMEMLIMIT(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	d := Apply(t.TempDir(), "512MiB")
	if d.Set != 0 || !strings.Contains(d.Why, "GOMEMLIMIT=512MiB") || debug.SetMemoryLimit(-1) != before {
		t.Errorf("Apply with GOMEMLIMIT: %+v", d)
	}
}

// childEnv marks the process TestRealCgroupV1 starts in a cgroup of its own.
const childEnv = "MEMLIMIT_TEST_CHILD"

// TestRealCgroupV1: a process in a real cgroup v1 memory cgroup with a
// 96 MiB limit finds it, and Apply sets 90 % of it. Needs root and a
// writable v1 memory hierarchy (skipped otherwise).
func TestRealCgroupV1(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		// The child: wait until moved, then report.
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		cg, _ := os.ReadFile("/proc/self/cgroup")
		d := Apply("/", "")
		fmt.Printf("limit=%d set=%d got=%d from=%s why=%s\ncgroup:\n%s", d.Limit, d.Set, debug.SetMemoryLimit(-1), d.From, d.Why, cg)
		return
	}
	base := "/sys/fs/cgroup/memory"
	if st, err := os.Stat(filepath.Join(base, "memory.limit_in_bytes")); err != nil || os.Geteuid() != 0 || st.IsDir() {
		t.Skip("needs root and a cgroup v1 memory hierarchy at " + base)
	}
	dir := filepath.Join(base, fmt.Sprintf("meshagent-memlimit-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a memory cgroup: %v", err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	const limit = 96 << 20
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.Itoa(limit)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRealCgroupV1$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal(err)
	}
	_, _ = in.Write([]byte("\n"))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), ":memory:/"+filepath.Base(dir)+"\n") {
		t.Skipf("the child's /proc/self/cgroup does not show it in %s (this kernel or sandbox does not report the move):\n%s", dir, out.String())
	}
	want := fmt.Sprintf("limit=%d set=%d got=%d from=%s", limit, limit*9/10, limit*9/10, filepath.Join(dir, "memory.limit_in_bytes"))
	if !strings.Contains(out.String(), want) {
		t.Errorf("child reported %q, want %q", out.String(), want)
	}
}

package main

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestMemoryLimitLogged: the start-up line says what soft memory limit the
// agent set from its cgroup (cgroup v2 and v1 files), or why it set none.
func TestMemoryLimitLogged(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	const (
		v2Mount = "30 22 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
		v1Mount = "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
	)
	for _, tt := range []struct {
		name       string
		files      map[string]string
		gomemlimit string
		msg        string
		fields     map[string]any
	}{
		{"v2", map[string]string{"proc/self/cgroup": "0::/c\n", "proc/self/mountinfo": v2Mount, "sys/fs/cgroup/cgroup.controllers": "memory\n", "sys/fs/cgroup/c/memory.max": "134217728\n"}, "",
			"soft memory limit set from the cgroup", map[string]any{"soft_memory_limit": int64(120795955), "cgroup_memory_limit": int64(134217728), "path": "/sys/fs/cgroup/c/memory.max"}},
		{"v1", map[string]string{"proc/self/cgroup": "4:memory:/c\n", "proc/self/mountinfo": v1Mount, "sys/fs/cgroup/memory/c/memory.limit_in_bytes": "67108864\n"}, "",
			"soft memory limit set from the cgroup", map[string]any{"soft_memory_limit": int64(60397977), "cgroup_memory_limit": int64(67108864), "path": "/sys/fs/cgroup/memory/c/memory.limit_in_bytes"}},
		{"no limit", map[string]string{"proc/self/cgroup": "0::/c\n", "proc/self/mountinfo": v2Mount, "sys/fs/cgroup/cgroup.controllers": "memory\n", "sys/fs/cgroup/c/memory.max": "max\n"}, "",
			"no soft memory limit set from the cgroup", map[string]any{"reason": "no cgroup memory limit"}},
		{"GOMEMLIMIT", nil, "100MiB",
			"no soft memory limit set from the cgroup", map[string]any{"reason": "GOMEMLIMIT=100MiB is set: the Go runtime uses it"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for p, c := range tt.files {
				full := filepath.Join(root, p)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			core, logs := observer.New(zap.InfoLevel)
			setMemoryLimit(zap.New(core), root, tt.gomemlimit)
			all := logs.All()
			if len(all) != 1 || all[0].Message != tt.msg {
				t.Fatalf("logged %+v, want one line %q", all, tt.msg)
			}
			got := all[0].ContextMap()
			for k, v := range tt.fields {
				if got[k] != v {
					t.Errorf("%s = %v (%T), want %v", k, got[k], got[k], v)
				}
			}
		})
	}
}

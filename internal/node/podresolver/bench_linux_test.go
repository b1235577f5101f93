package podresolver

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/test/podproc"
)

// BenchmarkResolve: one resolution of a real process in a pod cgroup through
// the real /proc, with a pidfd (what each new connection costs).
func BenchmarkResolve(b *testing.B) {
	r, err := New(Config{Pods: podMap{uidA: pod("shop", "cart-0", uidA, "cart", corev1.PodRunning)}})
	if err != nil {
		b.Fatal(err)
	}
	proc := podproc.Start(b, podproc.Cgroupfs, uidA, cid)
	cred := caller.Cred{UID: 1000, PID: int32(proc.Process.Pid)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Resolve(context.Background(), cred); err != nil {
			b.Fatal(err)
		}
	}
}

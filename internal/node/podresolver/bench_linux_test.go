package podresolver

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
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

// BenchmarkStartTimeManyThreads: the start time of a process of 4,000
// threads, from its main thread's stat file (what the resolver reads) and
// from the process's (what it read before: the kernel sums every thread's
// times into it).
func BenchmarkStartTimeManyThreads(b *testing.B) {
	const threads = 4000
	stop := make(chan struct{})
	var started, ended sync.WaitGroup
	for range threads {
		started.Add(1)
		ended.Go(func() {
			runtime.LockOSThread() // a thread of its own until stop
			started.Done()
			<-stop
		})
	}
	started.Wait()
	defer func() { close(stop); ended.Wait() }()
	pid := int32(os.Getpid())
	dir := filepath.Join("/proc", strconv.Itoa(int(pid)))
	buf := make([]byte, 0, procBuffer)
	b.Run("task", func(b *testing.B) {
		for b.Loop() {
			if _, err := startTime(dir, pid, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("process", func(b *testing.B) {
		for b.Loop() {
			data, err := appendFile(buf, filepath.Join(dir, "stat"), maxStatFile)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := parseStartTime(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

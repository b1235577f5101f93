package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestParseStatusKB(t *testing.T) {
	status := []byte("Name:\tmeshagent\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nThreads:\t7\n")
	if got, err := parseStatusKB(status, "VmRSS"); err != nil || got != 10240 {
		t.Errorf("VmRSS = %d, %v", got, err)
	}
	if got, err := parseStatusKB(status, "VmHWM"); err != nil || got != 20480 {
		t.Errorf("VmHWM = %d, %v", got, err)
	}
	for _, key := range []string{"VmSwap", "Threads", "Name"} {
		if _, err := parseStatusKB(status, key); err == nil {
			t.Errorf("%s: no error", key)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	// Fields after the name: state ppid pgrp session tty tpgid flags minflt
	// cminflt majflt cmajflt utime stime ...
	stat := []byte("42 (a) b) (c) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 7 0\n")
	got, err := parseStatCPU(stat)
	if err != nil || got != 3250*time.Millisecond {
		t.Errorf("parseStatCPU = %v, %v; want 3.25s", got, err)
	}
	for _, bad := range []string{"", "42 meshagent S 1", "42 (x) S 1 2 3", "42 (x) S 1 42 42 0 -1 0 0 0 0 0 -5 1"} {
		if _, err := parseStatCPU([]byte(bad)); err == nil {
			t.Errorf("parseStatCPU(%q): no error", bad)
		}
	}
}

func TestProcOfSelf(t *testing.T) {
	pid := os.Getpid()
	rss, err := rssKB(pid)
	if err != nil || rss <= 0 {
		t.Fatalf("rssKB = %d, %v", rss, err)
	}
	hwm, err := hwmKB(pid)
	if err != nil || hwm < rss {
		t.Fatalf("hwmKB = %d, %v (rss %d)", hwm, err, rss)
	}
	// Burn a little CPU; both counters must see it.
	s0, err := schedCPU(pid)
	if err != nil {
		t.Skipf("no schedstat: %v", err)
	}
	u0, err := statCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Spin until 30 ms of CPU show up, bounded: the machine may be busy.
	var s1 time.Duration
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		for start := time.Now(); time.Since(start) < 10*time.Millisecond; {
		}
		if s1, err = schedCPU(pid); err != nil || s1-s0 >= 30*time.Millisecond {
			break
		}
	}
	if err != nil || s1-s0 < 30*time.Millisecond {
		t.Errorf("schedCPU grew by %v (%v) after 5 s of spinning", s1-s0, err)
	}
	u1, _ := statCPU(pid)
	if u1 < u0 {
		t.Errorf("statCPU went back from %v to %v", u0, u1)
	}
	if _, err := rssKB(1 << 30); err == nil {
		t.Error("rssKB of a process that does not exist: no error")
	}
}

func TestResetHWM(t *testing.T) {
	pid := os.Getpid()
	b := make([]byte, 64<<20)
	for i := range b {
		b[i] = 1
	}
	runtime.KeepAlive(b)
	hwm, err := hwmKB(pid)
	if err != nil {
		t.Fatal(err)
	}
	b = nil
	debug.FreeOSMemory() // hand the 64 MB back, so RSS drops below the peak
	if err := resetHWM(pid); err != nil {
		t.Skipf("cannot reset the peak RSS here: %v", err)
	}
	after, err := hwmKB(pid)
	if err != nil {
		t.Fatal(err)
	}
	if after > hwm-32<<10 {
		t.Errorf("peak after reset %d kB, before %d kB: not reset", after, hwm)
	}
}

func FuzzParseStatCPU(f *testing.F) {
	f.Add([]byte("42 (meshagent) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 7 0\n"))
	f.Add([]byte("1 ()) R"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := parseStatCPU(b)
		if err == nil && d < 0 {
			t.Errorf("negative CPU time %v", d)
		}
	})
}

func FuzzParseStatusKB(f *testing.F) {
	f.Add([]byte("VmRSS:\t 1024 kB\n"))
	f.Add([]byte("VmRSS: -1 kB\nVmRSS: 2 kB"))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := parseStatusKB(b, "VmRSS")
		if err == nil && n < 0 {
			t.Errorf("negative size %d", n)
		}
	})
}

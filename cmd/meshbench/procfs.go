package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
// It is 100 on every Linux architecture Go supports.
const clockTicks = 100

// procStatusKB reads one "<Key>:   <n> kB" line of /proc/<pid>/status, such as
// VmRSS or VmHWM, in kibibytes.
func procStatusKB(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading status of %d: %w", pid, err)
	}
	return parseStatusKB(b, key)
}

// parseStatusKB finds key in the text of a /proc/<pid>/status file.
func parseStatusKB(status []byte, key string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("%s: unexpected value %q", key, v)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s: unexpected value %q", key, v)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%s: not in status", key)
}

// rssKB is the resident set size of pid now.
func rssKB(pid int) (int64, error) { return procStatusKB(pid, "VmRSS") }

// hwmKB is the peak resident set size of pid since it started or since
// resetHWM.
func hwmKB(pid int) (int64, error) { return procStatusKB(pid, "VmHWM") }

// resetHWM sets pid's peak RSS back to its current RSS (Linux 4.0+, needs
// the right to write the process's clear_refs, which a parent has).
func resetHWM(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("resetting peak RSS of %d: %w", pid, err)
	}
	return nil
}

// statCPU is the user plus system CPU time pid has used, from
// /proc/<pid>/stat (resolution 1/clockTicks s).
func statCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading stat of %d: %w", pid, err)
	}
	return parseStatCPU(b)
}

// parseStatCPU takes utime and stime (fields 14 and 15) from the text of a
// /proc/<pid>/stat file. The command name (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func parseStatCPU(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("stat: no command name")
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the command name", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("stat: bad time field %q", s)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// schedCPU is the CPU time pid's live threads have run, summed from
// /proc/<pid>/task/*/schedstat (nanosecond resolution). Time of threads that
// have exited is not included; Go rarely ends threads.
func schedCPU(pid int) (time.Duration, error) {
	paths, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(paths) == 0 {
		return 0, fmt.Errorf("no schedstat for %d", pid)
	}
	var total time.Duration
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) { // the thread ended meanwhile
				continue
			}
			return 0, fmt.Errorf("reading %s: %w", p, err)
		}
		d, err := parseSchedstat(b)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", p, err)
		}
		total += d
	}
	return total, nil
}

// parseSchedstat takes the run time (first field, ns) of a schedstat file.
func parseSchedstat(b []byte) (time.Duration, error) {
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, errors.New("empty schedstat")
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad schedstat %q", f[0])
	}
	return time.Duration(n), nil
}

// rssBreakdown describes what pid's RSS is made of: anonymous memory (heap,
// stacks), file-backed pages (the mapped binary) and shared memory.
func rssBreakdown(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, k := range []string{"RssAnon", "RssFile", "RssShmem", "VmStk", "Threads"} {
		if k == "Threads" {
			if v, ok := statusField(b, k); ok {
				parts = append(parts, "threads "+v)
			}
			continue
		}
		if n, err := parseStatusKB(b, k); err == nil {
			parts = append(parts, fmt.Sprintf("%s %d kB", k, n))
		}
	}
	return strings.Join(parts, ", ")
}

// statusField is the raw value of key in a status file.
func statusField(status []byte, key string) (string, bool) {
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

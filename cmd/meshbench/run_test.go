package main

import (
	"context"
	"os"
	"strings"
	"testing"
)

// TestRunAgainstAgent runs the whole benchmark, shortened, against the agent
// binary named by MESHBENCH_AGENT (for example bin/meshagent after `make
// build`), and checks that every figure is measured and printed in the
// `make bench` format. Without MESHBENCH_AGENT it is skipped: it needs a
// built agent that serves certificates from a CA.
func TestRunAgainstAgent(t *testing.T) {
	bin := os.Getenv("MESHBENCH_AGENT")
	if bin == "" {
		t.Skip("MESHBENCH_AGENT not set")
	}
	args := []string{
		"-agent", bin, "-cold-runs", "2", "-steady-runs", "1", "-settle", "200ms",
		"-cpu-window", "1s", "-cpu-windows", "1", "-conns", "2", "-streams-per-conn", "10",
		"-secret-ttl", "2s", "-rotations", "1", "-xds-small-bytes", "1000000", "-xds-bytes", "4000000", "-xds-runs", "1",
		"-timeout", "60s",
	}
	if a, ok := os.LookupEnv("MESHBENCH_AGENT_ARGS"); ok {
		args = append(args, "-agent-args", a)
	}
	opts, err := parseFlags(args, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	code := run(context.Background(), opts, &stdout, &stderr)
	t.Logf("stderr:\n%s", stderr.String())
	if code != 0 {
		t.Errorf("exit code %d", code)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	want := []string{
		"cold_start_ms", "cold_start_agent_cpu_ms", "cold_start_rsa2048_ms", "idle_rss_mb", "sds_streams_rss_kb_per_stream",
		"cpu_idle_ms_per_min",
		"xds_forward_1mb_ratio", "xds_forward_1mb_cpu_ratio", "xds_forward_1mb_proxy_cpu_ms",
		"xds_forward_1mb_peak_rss_over_idle_mb", "xds_forward_1mb_peak_rss_over_idle_x",
		"xds_forward_4mb_ratio", "xds_forward_4mb_cpu_ratio", "xds_forward_4mb_proxy_cpu_ms",
		"xds_forward_4mb_peak_rss_over_idle_mb", "xds_forward_4mb_peak_rss_over_idle_x",
		"workloadapi_streams_rss_kb_per_stream", "rotation_fanout_ms", "rotation_first_to_last_stream_ms",
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), stdout.String())
	}
	for i, name := range want {
		f := strings.Fields(lines[i])
		// BENCH name median unit (min x max y, n=k)[ target <= t]
		if len(f) != 9 && (len(f) != 12 || f[9] != "target") || f[0] != "BENCH" || f[1] != name || f[4] != "(min" || f[6] != "max" || !strings.HasPrefix(f[8], "n=") {
			t.Errorf("line %d: %q, want the %s figure", i, lines[i], name)
		}
	}
	live.Lock()
	n := len(live.procs)
	live.Unlock()
	if n != 0 {
		t.Errorf("%d agents left running", n)
	}
}

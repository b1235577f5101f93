package main

import (
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSummarize(t *testing.T) {
	tests := []struct {
		name    string
		samples []float64
		want    Summary
	}{
		{"none", nil, Summary{}},
		{"one", []float64{3}, Summary{Median: 3, Min: 3, Max: 3, N: 1}},
		{"odd", []float64{5, 1, 3}, Summary{Median: 3, Min: 1, Max: 5, N: 3}},
		{"even", []float64{4, 1, 2, 10}, Summary{Median: 3, Min: 1, Max: 10, N: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Summarize(tt.samples); got != tt.want {
				t.Errorf("Summarize(%v) = %+v, want %+v", tt.samples, got, tt.want)
			}
		})
	}
	in := []float64{3, 1, 2}
	Summarize(in)
	if in[0] != 3 || in[1] != 1 {
		t.Errorf("Summarize reordered its input: %v", in)
	}
}

func TestFigureLine(t *testing.T) {
	tests := []struct {
		f    Figure
		want string
	}{
		{Figure{Name: "cold_start_ms", Unit: "ms", Samples: []float64{31.25, 28.5, 40.126}}, "BENCH cold_start_ms 31.25 ms (min 28.50 max 40.13, n=3)"},
		{Figure{Name: "xds_forward_10mb_ratio", Unit: "x", Samples: []float64{1.0412}, Target: "<= 1.2"}, "BENCH xds_forward_10mb_ratio 1.041 x (min 1.041 max 1.041, n=1) target <= 1.2"},
		{Figure{Name: "xds_forward_100mb_peak_rss_mb", Unit: "MB", Samples: []float64{212.34, 250.01}}, "BENCH xds_forward_100mb_peak_rss_mb 231.2 MB (min 212.3 max 250.0, n=2)"},
		{Figure{Name: "sds_streams_rss_kb_per_stream", Unit: "KB", Samples: []float64{-0.5}}, "BENCH sds_streams_rss_kb_per_stream -0.500 KB (min -0.500 max -0.500, n=1)"},
	}
	for _, tt := range tests {
		if got := tt.f.Line(); got != tt.want {
			t.Errorf("Line() = %q, want %q", got, tt.want)
		}
	}
	if got := formatValue(math.NaN()); got != "NaN" {
		t.Errorf("formatValue(NaN) = %q", got)
	}
}

func TestReporter(t *testing.T) {
	var out strings.Builder
	r := &Reporter{out: &out}
	r.Report(Figure{Name: "a_ms", Unit: "ms", Samples: []float64{1}})
	r.Report(Figure{Name: "b_ms", Unit: "ms"})
	r.Fail("c_ms", io.ErrUnexpectedEOF)
	want := "BENCH a_ms 1.000 ms (min 1.000 max 1.000, n=1)\nBENCH b_ms FAIL no samples\nBENCH c_ms FAIL unexpected EOF\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
	if got := strings.Join(r.Failed(), ","); got != "b_ms,c_ms" {
		t.Errorf("Failed() = %q", got)
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(o.agent, "/bin/meshagent") || strings.Join(o.agentArgs, " ") != "run" || o.coldRuns != 20 || o.conns*o.perConn != 1000 || o.xdsBytes != 100_000_000 {
		t.Errorf("defaults: %+v", o)
	}
	for _, g := range groups {
		if !o.only[g] {
			t.Errorf("group %s not selected by default", g)
		}
	}
	if !slices.Equal(o.nodePods, []int{100, 1000}) || o.nodePodsPerSA != 10 || o.nodeBudget != 8 {
		t.Errorf("node defaults: %+v", o)
	}
	o, err = parseFlags([]string{"-node-pods", "100, 1000,5000"}, io.Discard)
	if err != nil || !slices.Equal(o.nodePods, []int{100, 1000, 5000}) {
		t.Errorf("-node-pods 100, 1000,5000: %v %v", o.nodePods, err)
	}
	o, err = parseFlags([]string{"-only", "cold, xds", "-agent-args", "run --log-level warn", "-secret-ttl", "5s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.only["cold"] || !o.only["xds"] || o.only["steady"] || o.only["rotation"] || len(o.agentArgs) != 3 || o.secretTTL != 5*time.Second {
		t.Errorf("parsed: %+v", o)
	}
	for _, bad := range [][]string{
		{"-only", "cold,warp"},
		{"-cold-runs", "0"},
		{"-secret-ttl", "1s"},
		{"-xds-bytes", "0"},
		{"-node-pods", "100,lots"},
		{"-node-pods", "0"},
		{"-node-pods-per-sa", "0"},
		{"extra"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

func TestPercentile(t *testing.T) {
	s := []float64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, c := range []struct{ p, want float64 }{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {1, 1}} {
		if got := Percentile(s, c.p); got != c.want {
			t.Errorf("Percentile(1..10, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if !math.IsNaN(Percentile(nil, 99)) {
		t.Error("Percentile of nothing is not NaN")
	}
	f := Figure{Name: "x_ms", Unit: "ms", Samples: s, P99: true, Target: "<= 20"}
	if got, want := f.Line(), "BENCH x_ms 5.500 ms (min 1.000 max 10.00, n=10) p99 10.00 target <= 20"; got != want {
		t.Errorf("Line() = %q, want %q", got, want)
	}
}

func TestIssueLog(t *testing.T) {
	var l issueLog
	if _, ok := l.latestBefore(time.Now()); ok {
		t.Fatal("empty log found an issuance")
	}
	t1 := l.now()
	t2 := l.now()
	if got, ok := l.latestBefore(t2); !ok || !got.Equal(t2) {
		t.Errorf("latestBefore(t2) = %v, %v", got, ok)
	}
	if got, ok := l.latestBefore(t1.Add(time.Nanosecond)); !ok || got.After(t1.Add(time.Nanosecond)) {
		t.Errorf("latestBefore(t1+1ns) = %v, %v", got, ok)
	}
	if _, ok := l.latestBefore(t1.Add(-time.Second)); ok {
		t.Error("found an issuance before the first")
	}
}

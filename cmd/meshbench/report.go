package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
)

// Figure is one measured quantity: its name, unit and every sample taken.
type Figure struct {
	// Name is the figure's name as printed, e.g. "cold_start_ms".
	Name string
	// Unit is printed after the median, e.g. "ms".
	Unit string
	// Samples holds one value per run.
	Samples []float64
	// Target, when set, is printed after the figure, e.g. "<= 1.2".
	Target string
	// P99, when set, adds the 99th percentile of the samples to the line;
	// the target is then the p99's.
	P99 bool
}

// Summary is the median, minimum and maximum of a figure's samples.
type Summary struct {
	Median, Min, Max float64
	N                int
}

// Summarize computes the summary of samples. The median of an even number of
// samples is the mean of the two middle ones. No samples give N == 0.
func Summarize(samples []float64) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Summary{Median: med, Min: s[0], Max: s[n-1], N: n}
}

// Percentile is the p-th percentile of samples by the nearest-rank rule:
// the smallest sample at or above p percent of them. No samples give NaN.
func Percentile(samples []float64, p float64) float64 {
	if len(samples) == 0 {
		return math.NaN()
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// Line formats the figure as the one line `make bench` prints:
//
//	BENCH <name> <median> <unit> (min <x> max <y>, n=<runs>)[ target <target>]
func (f Figure) Line() string {
	s := Summarize(f.Samples)
	line := fmt.Sprintf("BENCH %s %s %s (min %s max %s, n=%d)",
		f.Name, formatValue(s.Median), f.Unit, formatValue(s.Min), formatValue(s.Max), s.N)
	if f.P99 {
		line += " p99 " + formatValue(Percentile(f.Samples, 99))
	}
	if f.Target != "" {
		line += " target " + f.Target
	}
	return line
}

// formatValue prints three significant digits for small values and whole
// numbers with one decimal for large ones, without exponent notation.
func formatValue(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return strconv.FormatFloat(v, 'f', -1, 64)
	case math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case math.Abs(v) >= 10:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
}

// Reporter prints figures as they complete and remembers which failed.
type Reporter struct {
	out    io.Writer
	failed []string
}

// Report prints the figure's line, or a FAIL line when it has no samples.
func (r *Reporter) Report(f Figure) {
	if len(f.Samples) == 0 {
		r.Fail(f.Name, fmt.Errorf("no samples"))
		return
	}
	fmt.Fprintln(r.out, f.Line())
}

// Fail prints that a figure could not be measured, with the reason.
func (r *Reporter) Fail(name string, err error) {
	r.failed = append(r.failed, name)
	fmt.Fprintf(r.out, "BENCH %s FAIL %v\n", name, err)
}

// Failed lists the figures that could not be measured.
func (r *Reporter) Failed() []string { return r.failed }

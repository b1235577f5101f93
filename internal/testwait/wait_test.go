package testwait

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// recorder is a testing.TB that records a failure instead of ending the test.
type recorder struct {
	testing.TB
	failed atomic.Pointer[string]
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	msg := format
	r.failed.Store(&msg)
	// Fatalf must not return: end this goroutine as testing.T does.
	panic(r)
}

// run calls f with a recorder and reports the failure message, if any.
func run(t *testing.T, f func(tb testing.TB)) (failed string) {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != any(r) {
				panic(p)
			}
		}()
		f(r)
	}()
	if m := r.failed.Load(); m != nil {
		return *m
	}
	return ""
}

func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 3 {
			time.Sleep(time.Millisecond)
			n.Add(1)
		}
	}()
	if msg := run(t, func(tb testing.TB) { For(tb, "three", func() bool { return n.Load() == 3 }) }); msg != "" {
		t.Fatalf("failed: %s", msg)
	}
}

func TestWithinFailsWhenTheConditionNeverHolds(t *testing.T) {
	looks := 0
	msg := run(t, func(tb testing.TB) {
		Within(tb, 20*time.Millisecond, "never", func() bool { looks++; return false })
	})
	if !strings.HasPrefix(msg, "timed out") {
		t.Fatalf("failure %q, want a time-out", msg)
	}
	if looks < 2 {
		t.Fatalf("looked %d times, want again after the first", looks)
	}
}

func TestStepWaitsForATimer(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	fired := make(chan time.Time, 1)
	go func() {
		time.Sleep(5 * time.Millisecond)
		fired <- <-clk.After(time.Minute)
	}()
	if msg := run(t, func(tb testing.TB) { Step(tb, clk, time.Minute) }); msg != "" {
		t.Fatalf("failed: %s", msg)
	}
	select {
	case got := <-fired:
		if !got.Equal(time.Unix(60, 0)) {
			t.Fatalf("timer fired at %v", got)
		}
	case <-time.After(Timeout):
		t.Fatal("the timer set before the step did not fire")
	}
}

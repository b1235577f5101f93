package testwait

import (
	"errors"
	"fmt"
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
	msg := fmt.Sprintf(format, args...)
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

func TestEveryKeepsItsPaceAndSaysWhy(t *testing.T) {
	var times []time.Time
	msg := run(t, func(tb testing.TB) {
		Every(tb, 50*time.Millisecond, 20*time.Millisecond, "never", func() error {
			times = append(times, time.Now())
			return errors.New("not yet: 3 of 4")
		})
	})
	if !strings.HasPrefix(msg, "timed out") || !strings.Contains(msg, "never: not yet: 3 of 4") {
		t.Fatalf("failure %q, want a time-out with what and the last error", msg)
	}
	if len(times) < 2 {
		t.Fatalf("looked %d times, want again after the first", len(times))
	}
	for i := 1; i < len(times); i++ {
		if gap := times[i].Sub(times[i-1]); gap < 20*time.Millisecond {
			t.Fatalf("looked again after %v, want at least the pause of 20ms", gap)
		}
	}
	n := 0
	if msg := run(t, func(tb testing.TB) {
		Every(tb, Timeout, time.Millisecond, "the third look", func() error {
			if n++; n < 3 {
				return errors.New("not yet")
			}
			return nil
		})
	}); msg != "" || n != 3 {
		t.Fatalf("failed after %d looks: %s", n, msg)
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

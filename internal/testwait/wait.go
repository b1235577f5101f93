// Package testwait holds what the tests of many packages share: waiting in
// real time for a condition that another goroutine or process makes true,
// and stepping a fake clock once the code under test waits on it. It is
// imported only by _test.go files.
package testwait

import (
	"testing"
	"time"
)

// Timeout is how long For waits before it fails the test: long enough
// for a loaded machine running the race detector, short enough that a
// condition that never holds fails the test rather than the run.
const Timeout = 10 * time.Second

// The pause between two looks at a condition starts short, for a
// condition that holds soon, and grows to maxPause, so that a costly look (an
// HTTP request, a list from the API server) is not repeated in a busy loop.
const (
	firstPause = time.Millisecond
	maxPause   = 20 * time.Millisecond
)

// For looks at cond until it holds, failing t after Timeout. what says
// what was awaited ("the renewal timer").
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Within(t, Timeout, what, cond)
}

// Within looks at cond until it holds, failing t after within.
func Within(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for pause := firstPause; !cond(); pause = min(2*pause, maxPause) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(pause)
	}
}

// Every runs check every pause until it returns nil, failing t after within
// with what and check's last error. It is for a costly look whose pace
// matters (a new connection to a socket that limits each caller's
// connection rate, a request to istiod or the API server) and whose error
// says why it does not hold yet.
func Every(t testing.TB, within, pause time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %v", within, what, err)
		}
		time.Sleep(pause)
	}
}

// FakeClock is the part of k8s.io/utils/clock/testing.FakeClock that
// Timer and Step use.
type FakeClock interface {
	HasWaiters() bool
	Step(d time.Duration)
}

// Timer waits until something waits on clk: a timer, ticker or After
// is set. Stepping before then would move time past a timer not yet set.
func Timer(t testing.TB, clk FakeClock) {
	t.Helper()
	For(t, "a timer on the fake clock", clk.HasWaiters)
}

// Step advances clk by d once something waits on it.
func Step(t testing.TB, clk FakeClock, d time.Duration) {
	t.Helper()
	Timer(t, clk)
	clk.Step(d)
}

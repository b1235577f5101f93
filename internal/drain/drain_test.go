package drain

import (
	"context"
	"os"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// started counts Started calls.
type started struct{ n int }

func (s *started) call() { s.n++ }

func newLogs() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.InfoLevel)
	return zap.New(core), logs
}

// TestDrainLastsThePeriod: the context stays open through the period after
// the first signal and ends at its end, not a moment earlier; the start
// (with its length) and the end are logged; Started is called once.
func TestDrainLastsThePeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sigs := make(chan os.Signal, 2)
		log, logs := newLogs()
		var s started
		ctx, stop := Context(t.Context(), sigs, Config{Period: 30 * time.Second, Started: s.call, Logger: log})
		defer stop()

		time.Sleep(time.Hour) // no signal: no stop
		synctest.Wait()
		if ctx.Err() != nil || s.n != 0 {
			t.Fatalf("stopped (%v) or started (%d) without a signal", ctx.Err(), s.n)
		}
		sigs <- syscall.SIGTERM
		begin := time.Now()
		synctest.Wait()
		if s.n != 1 {
			t.Fatalf("Started called %d times, want 1", s.n)
		}
		time.Sleep(30*time.Second - time.Nanosecond)
		synctest.Wait()
		if ctx.Err() != nil {
			t.Fatal("stopped before the period ended")
		}
		<-ctx.Done()
		if d := time.Since(begin); d != 30*time.Second {
			t.Errorf("stopped %v after the signal, want 30s", d)
		}
		if s.n != 1 {
			t.Errorf("Started called %d times, want 1", s.n)
		}
		st := logs.FilterMessageSnippet("drain started").All()
		if len(st) != 1 || st[0].ContextMap()["drain"] != 30*time.Second || st[0].ContextMap()["signal"] != "terminated" {
			t.Errorf("start logged as %+v", st)
		}
		if logs.FilterMessageSnippet("drain ended").Len() != 1 {
			t.Errorf("end not logged: %+v", logs.All())
		}
	})
}

// TestSecondSignalStopsAtOnce: a second signal (SIGTERM or SIGINT) during
// a drain of minutes ends it with no time passing.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	for _, second := range []os.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(second.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sigs := make(chan os.Signal, 2)
				log, logs := newLogs()
				ctx, stop := Context(t.Context(), sigs, Config{Period: 10 * time.Minute, Logger: log})
				defer stop()
				sigs <- syscall.SIGTERM
				time.Sleep(time.Minute)
				synctest.Wait()
				if ctx.Err() != nil {
					t.Fatal("stopped a minute into a 10-minute drain")
				}
				at := time.Now()
				sigs <- second
				<-ctx.Done()
				if time.Since(at) != 0 {
					t.Errorf("stopped %v after the second signal, want at once", time.Since(at))
				}
				if logs.FilterMessageSnippet("cut short by a second signal").Len() != 1 || logs.FilterMessageSnippet("drain ended").Len() != 0 {
					t.Errorf("logs: %+v", logs.All())
				}
			})
		})
	}
}

// TestZeroPeriodStopsAtOnce: no drain: the first signal stops, Started is
// not called (readiness need not change for an instant).
func TestZeroPeriodStopsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sigs := make(chan os.Signal, 1)
		log, logs := newLogs()
		var s started
		ctx, stop := Context(t.Context(), sigs, Config{Started: s.call, Logger: log})
		defer stop()
		at := time.Now()
		sigs <- syscall.SIGINT
		<-ctx.Done()
		if time.Since(at) != 0 || s.n != 0 {
			t.Errorf("stopped after %v, Started %d times; want at once, never", time.Since(at), s.n)
		}
		if logs.FilterMessageSnippet("without a drain").Len() != 1 {
			t.Errorf("logs: %+v", logs.All())
		}
	})
}

// TestStopEndsTheDrain: the agent stopping for another reason
// (/quitquitquit) during a drain: stop returns at once, with the goroutine
// gone (synctest fails a test that leaves one blocked), and the context
// ends with its parent.
func TestStopEndsTheDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sigs := make(chan os.Signal, 1)
		ctx, stop := Context(t.Context(), sigs, Config{Period: time.Hour})
		sigs <- syscall.SIGTERM
		synctest.Wait()
		at := time.Now()
		stop()
		if ctx.Err() == nil || time.Since(at) != 0 {
			t.Errorf("after stop: err %v after %v", ctx.Err(), time.Since(at))
		}
		stop() // twice is safe
	})
	synctest.Test(t, func(t *testing.T) {
		parent, cancel := context.WithCancel(t.Context())
		ctx, stop := Context(parent, make(chan os.Signal), Config{Period: time.Hour})
		defer stop()
		cancel()
		<-ctx.Done()
	})
}

package secretmanager

import (
	"math"
	"testing"
	"time"
)

func TestRenewAt(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name     string
		issued   time.Time
		notAfter time.Time
		p        Policy
		u        float64
		want     time.Duration // after issued
	}{
		{"half of 24h", t0, t0.Add(24 * time.Hour), Policy{GraceRatio: 0.5}, 0.3, 12 * time.Hour},
		{"jitter at mid draw is zero", t0, t0.Add(24 * time.Hour), Policy{GraceRatio: 0.5, GraceJitter: 0.01}, 0.5, 12 * time.Hour},
		{"jitter low draw renews later", t0, t0.Add(24 * time.Hour), Policy{GraceRatio: 0.5, GraceJitter: 0.01}, 0, 12*time.Hour + 864*time.Second},
		{"jitter high draw renews earlier", t0, t0.Add(100 * time.Second), Policy{GraceRatio: 0.5, GraceJitter: 0.1}, 1, 40 * time.Second},
		{"linkerd 70 percent", t0, t0.Add(100 * time.Second), Policy{GraceRatio: 0.3}, 0.5, 70 * time.Second},
		{"ratio clamped at 1 renews at once", t0, t0.Add(time.Hour), Policy{GraceRatio: 0.99, GraceJitter: 0.5}, 0.99, 0},
		{"ratio clamped at 0 renews at expiry", t0, t0.Add(time.Hour), Policy{GraceRatio: 0.01, GraceJitter: 0.5}, 0, time.Hour},
		{"min delay", t0, t0.Add(12 * time.Second), Policy{GraceRatio: 0.3, MinDelay: 10 * time.Second}, 0.5, 10 * time.Second},
		{"min delay never past expiry", t0, t0.Add(5 * time.Second), Policy{GraceRatio: 0.3, MinDelay: 10 * time.Second}, 0.5, 5 * time.Second},
		{"max delay", t0, t0.Add(90 * 24 * time.Hour), Policy{GraceRatio: 0.3, MaxDelay: 24 * time.Hour}, 0.5, 24 * time.Hour},
		{"expired on arrival", t0, t0.Add(-time.Minute), Policy{GraceRatio: 0.5}, 0.5, 0},
		{"draw out of range is clamped", t0, t0.Add(100 * time.Second), Policy{GraceRatio: 0.5, GraceJitter: 0.1}, 7, 40 * time.Second},
		{"NaN draw is clamped", t0, t0.Add(100 * time.Second), Policy{GraceRatio: 0.5, GraceJitter: 0.1}, math.NaN(), 60 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := RenewAt(tt.issued, tt.notAfter, tt.p, tt.u).Sub(tt.issued)
			if d := got - tt.want; d > time.Millisecond || d < -time.Millisecond {
				t.Errorf("RenewAt = issued + %s, want issued + %s", got, tt.want)
			}
		})
	}
}

// The default policy renews a 24h certificate at 12h give or take 15 minutes
// (FACTS: ratio 0.5, jitter 0.01).
func TestRenewAtDefaultSpread(t *testing.T) {
	t0 := time.Now()
	p := Policy{GraceRatio: DefaultGraceRatio, GraceJitter: DefaultGraceJitter}
	lo := RenewAt(t0, t0.Add(24*time.Hour), p, 0.999999).Sub(t0)
	hi := RenewAt(t0, t0.Add(24*time.Hour), p, 0).Sub(t0)
	if lo < 12*time.Hour-15*time.Minute || hi > 12*time.Hour+15*time.Minute || hi-lo < 28*time.Minute {
		t.Errorf("spread [%s, %s], want 12h ± 15m", lo, hi)
	}
}

func TestRetryDelay(t *testing.T) {
	tests := []struct {
		name    string
		attempt int
		base    time.Duration
		limit   time.Duration
		u       float64
		want    time.Duration
	}{
		{"first, low draw", 0, time.Second, time.Minute, 0, 500 * time.Millisecond},
		{"first, high draw", 0, time.Second, time.Minute, 0.999999999, time.Second},
		{"doubles", 3, time.Second, time.Minute, 0, 4 * time.Second},
		{"capped", 10, time.Second, time.Minute, 0, 30 * time.Second},
		{"capped high", 10, time.Second, time.Minute, 0.999999999, time.Minute},
		{"huge attempt does not overflow", math.MaxInt, time.Second, time.Minute, 0, 30 * time.Second},
		{"limit below base", 2, time.Second, time.Millisecond, 0, 500 * time.Millisecond},
		{"no base", 2, 0, time.Minute, 0.5, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := RetryDelay(tt.attempt, tt.base, tt.limit, tt.u)
			if d := got - tt.want; d > time.Millisecond || d < -time.Millisecond {
				t.Errorf("RetryDelay = %s, want %s", got, tt.want)
			}
		})
	}
}

func FuzzRenewAt(f *testing.F) {
	f.Add(int64(86400), 0.5, 0.01, 0.5, int64(0), int64(0))
	f.Add(int64(-5), 2.0, -1.0, math.NaN(), int64(10), int64(-1))
	f.Fuzz(func(t *testing.T, lifeSec int64, ratio, jitter, u float64, minSec, maxSec int64) {
		t0 := time.Unix(1_800_000_000, 0)
		notAfter := t0.Add(time.Duration(lifeSec%(1<<30)) * time.Second)
		p := Policy{GraceRatio: ratio, GraceJitter: jitter,
			MinDelay: time.Duration(minSec%(1<<30)) * time.Second, MaxDelay: time.Duration(maxSec%(1<<30)) * time.Second}
		got := RenewAt(t0, notAfter, p, u)
		if got.Before(t0) {
			t.Fatalf("renewal %s before arrival %s", got, t0)
		}
		if notAfter.After(t0) && got.After(notAfter) && !(p.MaxDelay > 0 && p.MaxDelay < p.MinDelay) {
			t.Fatalf("renewal %s after expiry %s", got, notAfter)
		}
	})
}

package secretmanager

import (
	"math"
	"testing"
	"time"
)

func TestRenewAt(t *testing.T) {
	t.Parallel()
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
		{"ratio clamped at 1 renews at the floor, 1 % of life", t0, t0.Add(time.Hour), Policy{GraceRatio: 0.99, GraceJitter: 0.5}, 0.99, 36 * time.Second},
		{"ratio 1 on 24h renews after 14.4 min", t0, t0.Add(24 * time.Hour), Policy{GraceRatio: 1}, 0.5, 864 * time.Second},
		{"ratio 1 on 1 min renews after the 5 s floor", t0, t0.Add(time.Minute), Policy{GraceRatio: 1}, 0.5, 5 * time.Second},
		{"ratio 1 on 4 s renews at half life", t0, t0.Add(4 * time.Second), Policy{GraceRatio: 1}, 0.5, 2 * time.Second},
		{"ratio 1 on 1 s renews after 1 s", t0, t0.Add(time.Second), Policy{GraceRatio: 1}, 0.5, time.Second},
		{"ratio clamped at 0 renews at expiry", t0, t0.Add(time.Hour), Policy{GraceRatio: 0.01, GraceJitter: 0.5}, 0, time.Hour},
		{"min delay", t0, t0.Add(12 * time.Second), Policy{GraceRatio: 0.3, MinDelay: 10 * time.Second}, 0.5, 10 * time.Second},
		{"min delay never past expiry", t0, t0.Add(5 * time.Second), Policy{GraceRatio: 0.3, MinDelay: 10 * time.Second}, 0.5, 5 * time.Second},
		{"max delay", t0, t0.Add(90 * 24 * time.Hour), Policy{GraceRatio: 0.3, MaxDelay: 24 * time.Hour}, 0.5, 24 * time.Hour},
		{"expired on arrival waits the 1 s floor", t0, t0.Add(-time.Minute), Policy{GraceRatio: 0.5}, 0.5, time.Second},
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
	t.Parallel()
	t0 := time.Now()
	p := Policy{GraceRatio: 0.5, GraceJitter: 0.01} // SECRET_GRACE_PERIOD_RATIO and its jitter's defaults
	lo := RenewAt(t0, t0.Add(24*time.Hour), p, 0.999999).Sub(t0)
	hi := RenewAt(t0, t0.Add(24*time.Hour), p, 0).Sub(t0)
	if lo < 12*time.Hour-15*time.Minute || hi > 12*time.Hour+15*time.Minute || hi-lo < 28*time.Minute {
		t.Errorf("spread [%s, %s], want 12h ± 15m", lo, hi)
	}
}

func TestRenewalFloor(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ life, want time.Duration }{
		{24 * time.Hour, 864 * time.Second},
		{time.Hour, 36 * time.Second},
		{10 * time.Minute, 6 * time.Second},
		{time.Minute, 5 * time.Second},
		{6 * time.Second, 3 * time.Second},
		{time.Second, time.Second},
		{0, time.Second},
		{-time.Hour, time.Second},
	} {
		if got := RenewalFloor(tt.life); got != tt.want {
			t.Errorf("RenewalFloor(%s) = %s, want %s", tt.life, got, tt.want)
		}
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
		if got.Before(t0.Add(time.Second)) && !(p.MaxDelay > 0 && p.MaxDelay < time.Second) {
			t.Fatalf("renewal %s less than a second after arrival %s", got, t0)
		}
		if notAfter.Sub(t0) >= 2*time.Second && got.After(notAfter) && !(p.MaxDelay > 0 && p.MaxDelay < p.MinDelay) {
			t.Fatalf("renewal %s after expiry %s", got, notAfter)
		}
	})
}

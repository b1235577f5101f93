package backoff

import (
	"math"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	tests := []struct {
		name    string
		attempt int
		p       Policy
		u       float64
		want    time.Duration
	}{
		{"first, low draw", 0, Policy{time.Second, time.Minute}, 0, 500 * time.Millisecond},
		{"first, high draw", 0, Policy{time.Second, time.Minute}, 0.999999999, time.Second},
		{"doubles", 3, Policy{time.Second, time.Minute}, 0, 4 * time.Second},
		{"capped", 10, Policy{time.Second, time.Minute}, 0, 30 * time.Second},
		{"capped high", 10, Policy{time.Second, time.Minute}, 0.999999999, time.Minute},
		{"huge attempt does not overflow", math.MaxInt, Policy{time.Second, time.Minute}, 0, 30 * time.Second},
		{"cap below base", 2, Policy{time.Second, time.Millisecond}, 0, 500 * time.Millisecond},
		{"no base", 2, Policy{0, time.Minute}, 0.5, 0},
		{"draw above 1 clamped", 0, Policy{time.Second, time.Minute}, 7, time.Second},
		{"NaN draw", 0, Policy{time.Second, time.Minute}, math.NaN(), 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.p.Delay(tt.attempt, tt.u)
			if d := got - tt.want; d > time.Millisecond || d < -time.Millisecond {
				t.Errorf("Delay = %s, want %s", got, tt.want)
			}
		})
	}
}

func FuzzDelay(f *testing.F) {
	f.Add(0, int64(time.Second), int64(time.Minute), 0.5)
	f.Add(64, int64(1), int64(-1), math.Inf(1))
	f.Fuzz(func(t *testing.T, attempt int, base, limit int64, u float64) {
		p := Policy{Base: time.Duration(base), Cap: time.Duration(limit)}
		got := p.Delay(attempt, u)
		if got < 0 {
			t.Fatalf("negative delay %s", got)
		}
		if p.Base > 0 && got > max(p.Cap, p.Base) {
			t.Fatalf("delay %s above the cap %s", got, max(p.Cap, p.Base))
		}
	})
}

package secretmanager

import "time"

// Policy is the rotation schedule of SPEC 8.
type Policy struct {
	// GraceRatio is the share of a certificate's life left when it is renewed
	// (SECRET_GRACE_PERIOD_RATIO).
	GraceRatio float64
	// GraceJitter spreads GraceRatio uniformly over [-J, +J]
	// (SECRET_GRACE_PERIOD_RATIO_JITTER).
	GraceJitter float64
	// MinDelay and MaxDelay clamp the time from arrival to renewal; zero means
	// no clamp. MinDelay never moves the renewal past the expiry.
	MinDelay, MaxDelay time.Duration
}

// RenewAt returns when a certificate that arrived at issued (local time) and
// expires at notAfter is to be replaced. u is a uniform draw from [0, 1) that
// places the jitter. With life = notAfter - issued and
// r = clamp(GraceRatio + GraceJitter*(2u-1), 0, 1), the answer is
// notAfter - r*life, with the delay from issued then clamped to
// [MinDelay, MaxDelay]. A certificate that arrived expired is renewed at once.
func RenewAt(issued, notAfter time.Time, p Policy, u float64) time.Time {
	life := notAfter.Sub(issued)
	if life <= 0 {
		return issued
	}
	u = clamp01(u)
	r := clamp01(p.GraceRatio + p.GraceJitter*(2*u-1))
	grace := time.Duration(r * float64(life))
	delay := life - grace
	if p.MinDelay > 0 && delay < p.MinDelay {
		delay = min(p.MinDelay, life)
	}
	if p.MaxDelay > 0 && delay > p.MaxDelay {
		delay = p.MaxDelay
	}
	return issued.Add(delay)
}

// RetryDelay is the wait before retry number attempt (0 for the first retry):
// base doubled per attempt and capped at limit, then spread over [d/2, d) by u,
// a uniform draw from [0, 1).
func RetryDelay(attempt int, base, limit time.Duration, u float64) time.Duration {
	if base <= 0 {
		return 0
	}
	if limit < base {
		limit = base
	}
	d := base
	for i := 0; i < attempt && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	half := d / 2
	return half + time.Duration(clamp01(u)*float64(d-half))
}

// clamp01 limits v to [0, 1]; NaN becomes 0.
func clamp01(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	if v > 1 {
		return 1
	}
	return v
}

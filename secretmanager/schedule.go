package secretmanager

import (
	"time"

	"github.com/meshagent/meshagent/internal/backoff"
)

// Policy is the rotation schedule of docs/operations.md.
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

// Bounds of RenewalFloor.
const (
	// floorShare is the share of a certificate's life that must pass
	// between its arrival and its renewal.
	floorShare = 100 // 1 %
	// floorMin is the floor for lifetimes under 500 s (1 % of them is less).
	floorMin = 5 * time.Second
	// floorAbsolute is the floor whatever the lifetime: even a CA that
	// answers with certificates that are (nearly) expired is asked at most
	// once per second per identity.
	floorAbsolute = time.Second
)

// RenewalFloor is the least time from a certificate's arrival to its
// renewal, whatever the policy says: 1 % of its life but at least 5 s,
// capped at half its life (so short-lived certificates still renew before
// they expire), and never under 1 s. It keeps SECRET_GRACE_PERIOD_RATIO=1
// (renew at once) from turning the agent against the CA: a 24 h certificate
// is renewed at most every 14.4 min, a 1 h one every 36 s.
func RenewalFloor(life time.Duration) time.Duration {
	f := max(life/floorShare, floorMin)
	f = min(f, life/2)
	return max(f, floorAbsolute)
}

// RenewAt returns when a certificate that arrived at issued (local time) and
// expires at notAfter is to be replaced. u is a uniform draw from [0, 1) that
// places the jitter. With life = notAfter - issued and
// r = clamp(GraceRatio + GraceJitter*(2u-1), 0, 1), the delay from issued is
// life - r*life, raised to RenewalFloor(life), then clamped to
// [MinDelay, MaxDelay]. A certificate that arrived expired is renewed after
// the 1 s floor.
func RenewAt(issued, notAfter time.Time, p Policy, u float64) time.Time {
	life := notAfter.Sub(issued)
	if life <= 0 {
		return issued.Add(floorAbsolute)
	}
	u = backoff.Clamp01(u)
	r := backoff.Clamp01(p.GraceRatio + p.GraceJitter*(2*u-1))
	grace := time.Duration(r * float64(life))
	delay := max(life-grace, RenewalFloor(life))
	if p.MinDelay > 0 && delay < p.MinDelay {
		delay = min(p.MinDelay, life)
	}
	if p.MaxDelay > 0 && delay > p.MaxDelay {
		delay = p.MaxDelay
	}
	return issued.Add(delay)
}

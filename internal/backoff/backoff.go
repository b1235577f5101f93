// Package backoff is the one wait-before-retry rule of the agent: capped
// exponential backoff with jitter, as a pure function of the attempt number
// and a uniform random draw supplied by the caller (seeded or injected in
// tests). Everything that retries (the certificate cache, the xDS proxy's
// upstream reconnects) uses it; nothing retries inside a CA client.
//
// It owns no state, starts nothing and takes no lock.
package backoff

import "time"

// Default is the backoff of a request to the CA or the Kubernetes API that
// failed (the certificate cache, the Pod Certificates signer and its trust
// publisher): 0.5 s doubling to 60 s.
var Default = Policy{Base: 500 * time.Millisecond, Cap: 60 * time.Second}

// Policy is a capped exponential backoff: Base after the first failure,
// doubled per further failure up to Cap.
type Policy struct {
	// Base is the nominal wait after the first failure. Zero or less means
	// retries do not wait.
	Base time.Duration
	// Cap bounds the nominal wait; a Cap below Base is read as Base.
	Cap time.Duration
}

// Delay returns the wait before retry number attempt (0 after the first
// failure): d = min(Base * 2^attempt, Cap), spread uniformly over [d/2, d)
// by u, a uniform draw from [0, 1) (values outside are clamped, NaN reads as
// 0). Half the nominal wait is random, so clients that failed together do
// not come back together, and the wait never drops below d/2.
func (p Policy) Delay(attempt int, u float64) time.Duration {
	if p.Base <= 0 {
		return 0
	}
	limit := max(p.Cap, p.Base)
	d := p.Base
	for i := 0; i < attempt && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	half := d / 2
	return half + time.Duration(Clamp01(u)*float64(d-half))
}

// Clamp01 limits v to [0, 1]; NaN becomes 0. The backoff here and the
// renewal jitter (secretmanager.RenewAt) read their random draws through it.
func Clamp01(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	if v > 1 {
		return 1
	}
	return v
}

package podcert

import (
	"errors"
	"fmt"
	"time"
)

// Limits the API server puts on an issued pod certificate (certificates.k8s.io/v1
// PodCertificateRequest status validation).
const (
	// MinLifetime is the shortest life (NotAfter - NotBefore) it accepts.
	MinLifetime = time.Hour
	// MaxNotBeforeSkew is how far the leaf's NotBefore may lie from the API
	// server's clock.
	MaxNotBeforeSkew = 5 * time.Minute
	// RefreshMargin is how far beginRefreshAt must stay from NotBefore and
	// from NotAfter.
	RefreshMargin = 10 * time.Minute
	// DefaultMaxExpiration is the request's maxExpirationSeconds when it
	// sets none (the API server fills it in).
	DefaultMaxExpiration = 24 * time.Hour
)

// Reasons an answer's validity window is refused. lifetimeCheck wraps one.
var (
	// errTooLong: the leaf lives longer than the request allows; asking
	// again with the CA's backdating subtracted may fix it.
	errTooLong = errors.New("certificate lives longer than the request's maxExpirationSeconds")
	// errTooShort: the leaf lives less than the API's minimum of one hour.
	errTooShort = errors.New("certificate lives less than the one hour the API requires")
	// errSkewed: the CA backdated (or postdated) NotBefore further than the
	// API server accepts.
	errSkewed = errors.New("certificate's NotBefore is too far from now")
)

// lifetimes says what to ask of the CA for one request.
type lifetimes struct {
	// want is the life the certificate should have: the configured TTL,
	// raised to MinLifetime and capped at the request's maximum.
	want time.Duration
	// ask is want less the CA's expected backdating: the CA adds its
	// backdating to the validity it is asked for.
	ask time.Duration
}

// planLifetime returns the life to aim for and the validity to ask of a CA
// that backdates NotBefore by backdate, for a request allowing at most
// maxExp and an agent configured for ttl. ask stays at least one second.
func planLifetime(ttl, maxExp, backdate time.Duration) lifetimes {
	if maxExp <= 0 {
		maxExp = DefaultMaxExpiration
	}
	want := min(max(ttl, MinLifetime), maxExp)
	ask := want - max(backdate, 0)
	if ask < time.Second {
		ask = time.Second
	}
	return lifetimes{want: want, ask: ask}
}

// lifetimeCheck checks a leaf's validity window against what the API
// server accepts for a request allowing at most maxExp, at now.
func lifetimeCheck(notBefore, notAfter time.Time, maxExp time.Duration, now time.Time) error {
	if maxExp <= 0 {
		maxExp = DefaultMaxExpiration
	}
	life := notAfter.Sub(notBefore)
	switch {
	case notBefore.Before(now.Add(-MaxNotBeforeSkew)) || notBefore.After(now.Add(MaxNotBeforeSkew)):
		return fmt.Errorf("%w: NotBefore %s is %s from now, the API server accepts %s",
			errSkewed, notBefore.UTC().Format(time.RFC3339), now.Sub(notBefore).Round(time.Second), MaxNotBeforeSkew)
	case life > maxExp:
		return fmt.Errorf("%w: it lives %s, the request allows %s", errTooLong, life, maxExp)
	case life < MinLifetime:
		return fmt.Errorf("%w: it lives %s", errTooShort, life)
	}
	return nil
}

// beginRefreshAt is when the kubelet should start asking for the next
// certificate: when ratio of the life is left (SECRET_GRACE_PERIOD_RATIO),
// moved by jitter of the life (u uniform in [0, 1) spreads it over
// [-jitter, +jitter)), and kept RefreshMargin away from both ends, as the
// API server requires.
func beginRefreshAt(notBefore, notAfter time.Time, ratio, jitter, u float64) time.Time {
	life := notAfter.Sub(notBefore)
	share := 1 - ratio + jitter*(2*u-1)
	at := notBefore.Add(time.Duration(share * float64(life)))
	lo, hi := notBefore.Add(RefreshMargin), notAfter.Add(-RefreshMargin)
	if at.Before(lo) {
		at = lo
	}
	if at.After(hi) {
		at = hi
	}
	return at.Truncate(time.Second)
}

package xdsproxy

import "time"

// backoffDelay is the wait before upstream attempt number attempt+1 (attempt
// counts consecutive failures, from 0): initial doubled per failure, capped
// at maxDelay, then spread over [d/2, d) by r, a uniform draw from [0, 1), so
// streams that broke together do not come back together.
func backoffDelay(attempt int, initial, maxDelay time.Duration, r float64) time.Duration {
	d := initial
	for i := 0; i < attempt && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	return d/2 + time.Duration(r*float64(d/2))
}

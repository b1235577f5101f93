package main

import (
	"slices"
	"time"

	"github.com/meshagent/meshagent/test/istioca"
)

// budgetWindow is the window the CA budget is counted over.
const budgetWindow = time.Minute

// maxCSRsPerIdentityMinute is the CA budget: no identity may send more
// CSRs than this in any minute, whatever the CA does. With SECRET_TTL 30 s
// the schedule renews about four times a minute; the rest of the budget is
// for retries after the CA's faults, which back off.
const maxCSRsPerIdentityMinute = 30

// budget is the CA load one identity caused.
type budget struct {
	Identity string
	Total    int
	// MaxPerWindow is the most CSRs in any budgetWindow.
	MaxPerWindow int
	// At is when the busiest window began.
	At time.Time
}

// caBudget counts the CSRs of each identity the CA received, and the most
// received in any window of length w (a sliding window over arrival
// times). Identities are in order of name.
func caBudget(csrs []istioca.CSRRecord, w time.Duration) []budget {
	byID := map[string][]time.Time{}
	for _, c := range csrs {
		byID[c.Identity] = append(byID[c.Identity], c.At)
	}
	out := make([]budget, 0, len(byID))
	for id, ts := range byID {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		b := budget{Identity: id, Total: len(ts)}
		lo := 0
		for hi := range ts {
			for ts[hi].Sub(ts[lo]) >= w {
				lo++
			}
			if n := hi - lo + 1; n > b.MaxPerWindow {
				b.MaxPerWindow, b.At = n, ts[lo]
			}
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b budget) int {
		switch {
		case a.Identity < b.Identity:
			return -1
		case a.Identity > b.Identity:
			return 1
		}
		return 0
	})
	return out
}

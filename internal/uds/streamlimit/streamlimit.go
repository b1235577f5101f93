// Package streamlimit admits long-lived streams within a bound on all of
// them and a bound per caller, as the SDS and Workload API servers need.
// A Limit is safe for concurrent use; it starts nothing.
package streamlimit

import (
	"errors"
	"sync"
)

var (
	// ErrTotal refuses a stream over Limit.Max.
	ErrTotal = errors.New("too many streams")
	// ErrPerCaller refuses a stream over Limit.PerCaller.
	ErrPerCaller = errors.New("too many streams from this caller")
)

// Limit counts open streams. Set Max and PerCaller before first use.
type Limit struct {
	// Max bounds the streams open at once.
	Max int
	// PerCaller bounds the streams of one caller key open at once.
	PerCaller int

	mu   sync.Mutex
	open int
	per  map[string]int
}

// Acquire takes a place for a stream of the caller named by key (empty: only
// Max applies) or refuses it with ErrTotal or ErrPerCaller. release gives
// the place back; call it once.
func (l *Limit) Acquire(key string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open >= l.Max:
		return nil, ErrTotal
	case key != "" && l.per[key] >= l.PerCaller:
		return nil, ErrPerCaller
	}
	l.open++
	if key != "" {
		if l.per == nil {
			l.per = map[string]int{}
		}
		l.per[key]++
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.open--
		if key == "" {
			return
		}
		if l.per[key]--; l.per[key] == 0 {
			delete(l.per, key)
		}
	}, nil
}

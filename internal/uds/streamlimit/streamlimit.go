// Package streamlimit admits long-lived streams within a bound on all of
// them and a bound per caller, as the SDS and Workload API servers need.
// The per-caller count may be shared by several Limits (Callers), so that
// a pod's SDS and Workload API streams count together. A Limit is safe for
// concurrent use; it starts nothing.
package streamlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/uds/caller"
)

// Names are what Admit's refusals name as the bound to raise: the settings
// behind Max and PerCaller, as internal/app passes them. An empty name is
// left out.
type Names struct{ Max, PerCaller string }

// named is " (name)", or "" for no name.
func named(name string) string {
	if name == "" {
		return ""
	}
	return " (" + name + ")"
}

// The limits a stream is refused by: the reason of a Refusal, a metric
// label and a log field key of the servers.
const (
	ReasonMaxStreams          = "max_streams"
	ReasonMaxStreamsPerCaller = "max_streams_per_caller"
)

var (
	// ErrTotal refuses a stream over Limit.Max.
	ErrTotal = errors.New("too many streams")
	// ErrPerCaller refuses a stream over Limit.PerCaller.
	ErrPerCaller = errors.New("too many streams from this caller")
)

// Callers counts open streams per caller key; Limits sharing one count a
// caller's streams together. The zero value is ready.
type Callers struct {
	mu  sync.Mutex
	per map[string]int
}

func (c *Callers) acquire(key string, max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.per[key] >= max {
		return false
	}
	if c.per == nil {
		c.per = map[string]int{}
	}
	c.per[key]++
	return true
}

func (c *Callers) release(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.per[key]--; c.per[key] <= 0 {
		delete(c.per, key)
	}
}

// Limit counts open streams. Set its fields before first use.
type Limit struct {
	// Max bounds the streams open at once.
	Max int
	// PerCaller bounds the streams of one caller key open at once, counted
	// in Callers.
	PerCaller int
	// Callers is the per-caller count; nil means one of the Limit's own.
	Callers *Callers
	// Service ("SDS", "Workload API") and Names name the limit in Admit's
	// refusals.
	Service string
	Names   Names

	mu   sync.Mutex
	open int
	own  Callers
}

func (l *Limit) callers() *Callers {
	if l.Callers != nil {
		return l.Callers
	}
	return &l.own
}

// Acquire takes a place for a stream of the caller named by key (empty: only
// Max applies) or refuses it with ErrTotal or ErrPerCaller. release gives
// the place back; call it once.
func (l *Limit) Acquire(key string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open >= l.Max {
		return nil, ErrTotal
	}
	if key != "" && !l.callers().acquire(key, l.PerCaller) {
		return nil, ErrPerCaller
	}
	l.open++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.open--
		if key != "" {
			l.callers().release(key)
		}
	}, nil
}

// Refusal says which limit refused a stream.
type Refusal struct {
	// Reason is ReasonMaxStreams or ReasonMaxStreamsPerCaller.
	Reason string
	// Limit is the bound that was reached.
	Limit int
	// Cause is ErrTotal or ErrPerCaller.
	Cause error
}

// Admit is Acquire for a stream of the caller on ctx, keyed as the socket
// server resolved it (caller.Info.Key: a pod, or an identity; none in a
// sidecar, where Max alone applies). A refused stream gets a
// ResourceExhausted error naming the bound and the setting that raises it,
// and the Refusal says which limit it was.
func (l *Limit) Admit(ctx context.Context) (release func(), r Refusal, err error) {
	info, _ := caller.FromContext(ctx)
	release, err = l.Acquire(info.Key())
	switch {
	case errors.Is(err, ErrTotal):
		r = Refusal{Reason: ReasonMaxStreams, Limit: l.Max, Cause: err}
		err = status.Errorf(codes.ResourceExhausted, "too many %s streams: at most %d are served at once%s", l.Service, l.Max, named(l.Names.Max))
	case errors.Is(err, ErrPerCaller):
		r = Refusal{Reason: ReasonMaxStreamsPerCaller, Limit: l.PerCaller, Cause: err}
		err = status.Error(codes.ResourceExhausted, fmt.Sprintf("too many streams from this caller: at most %d SDS and Workload API streams are served at once%s", l.PerCaller, named(l.Names.PerCaller)))
	}
	return release, r, err
}

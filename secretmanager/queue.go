package secretmanager

import (
	stdheap "container/heap"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
)

// heap is a binary min-heap ordered by less (container/heap). The
// scheduler's queues use it with lazy deletion: an item whose entry moved
// on since it was pushed (its ticket is stale) is dropped when it reaches
// the top, so nothing is ever searched for or removed from the middle.
type heap[T any] struct {
	items []T
	less  func(a, b T) bool
}

func (h *heap[T]) len() int { return len(h.items) }

func (h *heap[T]) peek() T { return h.items[0] }

// push and pop move items with heap.Fix rather than heap.Push and
// heap.Pop, whose any-typed item costs an allocation each way:
// BenchmarkQueue (10,000 pushes and pops) makes 24 allocations this way
// (the hand-written heap it replaced: 23, in the same time), 20,024 through
// heap.Push/Pop, which also take about twice as long.
func (h *heap[T]) push(x T) {
	h.items = append(h.items, x)
	stdheap.Fix((*heapOps[T])(h), len(h.items)-1)
}

// pop removes the least item; the array is let go of once it is mostly
// empty, so a burst of identities does not pin its peak size.
func (h *heap[T]) pop() T {
	top := h.items[0]
	n := len(h.items) - 1
	h.items[0] = h.items[n]
	var zero T
	h.items[n] = zero
	h.items = h.items[:n]
	if n > 0 {
		stdheap.Fix((*heapOps[T])(h), 0)
	}
	if cap(h.items) > 64 && n < cap(h.items)/4 {
		h.items = append([]T(nil), h.items...)
	}
	return top
}

// heapOps is heap as container/heap's heap.Interface (Push and Pop are
// there for the interface; push and pop do not box through them).
type heapOps[T any] heap[T]

func (h *heapOps[T]) Len() int           { return len(h.items) }
func (h *heapOps[T]) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }
func (h *heapOps[T]) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *heapOps[T]) Push(x any)         { h.items = append(h.items, x.(T)) }
func (h *heapOps[T]) Pop() any {
	n := len(h.items) - 1
	x := h.items[n]
	var zero T
	h.items[n] = zero
	h.items = h.items[:n]
	return x
}

// queue names a place an entry can hold in the scheduler: due for a
// request (the timers queue, then the ready queue), or idle (waiting to be
// dropped).
type queue int

const (
	dueQueue queue = iota
	idleQueue
	numQueues
)

// stamp gives e a new ticket for q: whatever e held in q before is stale
// from now on. Called with Manager.mu held whenever e is (re)queued, when it
// stops being idle, and for every queue when it is dropped.
func (e *entry) stamp(q queue) uint64 {
	e.tickets[q]++
	return e.tickets[q]
}

// stale reports whether an item of q carrying ticket t no longer stands for
// e: the one way the queues tell a live item from a left-over one.
func (e *entry) stale(q queue, t uint64) bool { return e.tickets[q] != t }

// timed is an entry in a queue ordered by time: when it is due (the
// timers queue) or when it may be dropped (the idle queue).
type timed struct {
	e      *entry
	ticket uint64
	at     time.Time
}

func timedLess(a, b timed) bool { return a.at.Before(b.at) }

// ranked is a due entry, or a CSRJob, waiting for a CSR slot.
type ranked struct {
	e      *entry // nil for a job
	j      *job
	ticket uint64 // of dueQueue
	prio   priority
	due    time.Time
}

func (r ranked) id() pki.Identity {
	if r.j != nil {
		return r.j.id
	}
	return r.e.id
}

// rankedLess orders by priority (highest first), then due time (earliest
// first), then identity, so the order is deterministic.
func rankedLess(a, b ranked) bool {
	switch {
	case a.prio != b.prio:
		return a.prio > b.prio
	case !a.due.Equal(b.due):
		return a.due.Before(b.due)
	case a.id().SPIFFEID != b.id().SPIFFEID:
		return a.id().SPIFFEID < b.id().SPIFFEID
	}
	return a.id().DNSName < b.id().DNSName
}

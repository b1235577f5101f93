package secretmanager

import "time"

// heap is a binary min-heap ordered by less. The scheduler's queues use it
// with lazy deletion: an item whose entry moved on since it was pushed (its
// ticket is stale) is dropped when it reaches the top, so nothing is ever
// searched for or removed from the middle.
type heap[T any] struct {
	items []T
	less  func(a, b T) bool
}

func (h *heap[T]) len() int { return len(h.items) }

func (h *heap[T]) peek() T { return h.items[0] }

func (h *heap[T]) push(x T) {
	h.items = append(h.items, x)
	i := len(h.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.items[i], h.items[p]) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *heap[T]) pop() T {
	top := h.items[0]
	n := len(h.items) - 1
	h.items[0] = h.items[n]
	var zero T
	h.items[n] = zero
	h.items = h.items[:n]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h.less(h.items[l], h.items[m]) {
			m = l
		}
		if r < n && h.less(h.items[r], h.items[m]) {
			m = r
		}
		if m == i {
			break
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
	if cap(h.items) > 64 && n < cap(h.items)/4 {
		h.items = append([]T(nil), h.items...)
	}
	return top
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

// ranked is a due entry waiting for a CSR slot.
type ranked struct {
	e      *entry
	ticket uint64 // of dueQueue
	prio   priority
	due    time.Time
}

// rankedLess orders by priority (highest first), then due time (earliest
// first), then identity, so the order is deterministic.
func rankedLess(a, b ranked) bool {
	switch {
	case a.prio != b.prio:
		return a.prio > b.prio
	case !a.due.Equal(b.due):
		return a.due.Before(b.due)
	case a.e.id.SPIFFEID != b.e.id.SPIFFEID:
		return a.e.id.SPIFFEID < b.e.id.SPIFFEID
	}
	return a.e.id.DNSName < b.e.id.DNSName
}

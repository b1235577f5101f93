package secretmanager

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The timers queue pops in due order, whatever the order of pushes, and
// lets go of its array once it is mostly empty.
func TestQueuePopsInOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	h := heap[timed]{less: timedLess}
	base := time.Unix(0, 0)
	for range 1000 {
		h.push(timed{at: base.Add(time.Duration(r.IntN(500)) * time.Second)})
	}
	prev := base
	for h.len() > 0 {
		it := h.pop()
		if it.at.Before(prev) {
			t.Fatalf("popped %v after %v", it.at, prev)
		}
		prev = it.at
	}
	if c := cap(h.items); c > 64 {
		t.Errorf("empty queue still holds an array of %d", c)
	}
}

// BenchmarkQueue pushes and pops n entries of the timers queue, the work
// of the scheduler per entry moved.
func BenchmarkQueue(b *testing.B) {
	const n = 10000
	r := rand.New(rand.NewPCG(1, 2))
	at := make([]time.Time, n)
	for i := range at {
		at[i] = time.Unix(int64(r.IntN(n)), 0)
	}
	b.ReportAllocs()
	for b.Loop() {
		h := heap[timed]{less: timedLess}
		for _, a := range at {
			h.push(timed{at: a})
		}
		for h.len() > 0 {
			h.pop()
		}
	}
}

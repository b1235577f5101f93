package secret

import (
	"testing"
)

func TestHubSignalsMergeAndNeverBlock(t *testing.T) {
	var h hub
	const n = 2000
	chans := make([]<-chan struct{}, n)
	cancels := make([]func(), n)
	for i := range chans {
		chans[i], cancels[i] = h.watch()
	}
	// Nobody reads: three signals must neither block nor queue up.
	for range 3 {
		h.notify()
	}
	for i, ch := range chans {
		select {
		case <-ch:
		default:
			t.Fatalf("subscriber %d missed the signal", i)
		}
		select {
		case <-ch:
			t.Fatalf("subscriber %d got more than one merged signal", i)
		default:
		}
	}
	for _, c := range cancels {
		c()
		c() // twice is safe
	}
	h.mu.Lock()
	left := len(h.subs)
	h.mu.Unlock()
	if got := left; got != 0 {
		t.Fatalf("%d subscribers left after cancel", got)
	}
	h.notify()
}

func BenchmarkNotify1000(b *testing.B) {
	var h hub
	chans := make([]<-chan struct{}, 1000)
	for i := range chans {
		ch, cancel := h.watch()
		defer cancel()
		chans[i] = ch
	}
	b.ResetTimer()
	for range b.N {
		h.notify()
		for _, ch := range chans {
			<-ch
		}
	}
}

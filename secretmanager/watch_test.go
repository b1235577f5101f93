package secretmanager

import (
	"testing"
)

func TestHubSignalsMergeAndNeverBlock(t *testing.T) {
	var h hub
	const n = 2000
	chans := make([]<-chan struct{}, n)
	cancels := make([]func(), n)
	for i := range chans {
		chans[i], cancels[i] = h.watch("default")
	}
	other, cancelOther := h.watch("ROOTCA")
	defer cancelOther()

	// Nobody reads: three signals must neither block nor queue up.
	for range 3 {
		h.notify("default")
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
	select {
	case <-other:
		t.Fatal("a signal for default reached a ROOTCA subscriber")
	default:
	}

	for _, c := range cancels {
		c()
		c() // twice is safe
	}
	if got := h.count("default"); got != 0 {
		t.Fatalf("%d subscribers left after cancel", got)
	}
	h.notify("default")
}

func BenchmarkNotify1000(b *testing.B) {
	var h hub
	chans := make([]<-chan struct{}, 1000)
	for i := range chans {
		ch, cancel := h.watch("default")
		defer cancel()
		chans[i] = ch
	}
	b.ResetTimer()
	for range b.N {
		h.notify("default")
		for _, ch := range chans {
			<-ch
		}
	}
}

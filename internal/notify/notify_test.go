package notify

import "testing"

func TestSignalsMerge(t *testing.T) {
	s := Set{}
	a, b := s.Add(), s.Add()
	s.Signal()
	s.Signal() // merges with the pending one, does not block
	for _, ch := range []chan struct{}{a, b} {
		select {
		case <-ch:
		default:
			t.Fatal("a subscriber was not signalled")
		}
		select {
		case <-ch:
			t.Fatal("two signals did not merge")
		default:
		}
	}
	s.Remove(a)
	s.Signal()
	select {
	case <-a:
		t.Fatal("a removed subscriber was signalled")
	default:
	}
	if len(b) != 1 {
		t.Fatal("the remaining subscriber was not signalled")
	}
}

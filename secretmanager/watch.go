package secretmanager

import "sync"

// hub fans out change signals to its subscribers. Every subscriber owns a
// channel with a one-slot buffer; a signal is a non-blocking send, so signals
// merge while a subscriber is busy and a slow subscriber never holds up the
// others. Signalling is O(subscribers) and starts no goroutine.
type hub struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

// watch subscribes. The returned cancel is safe to call more than once.
func (h *hub) watch() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs == nil {
		h.subs = make(map[chan struct{}]struct{})
	}
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			delete(h.subs, ch)
		})
	}
}

// notify signals every subscriber without blocking.
func (h *hub) notify() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

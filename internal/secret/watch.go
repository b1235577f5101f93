package secret

import (
	"sync"

	"github.com/meshagent/meshagent/internal/notify"
)

// hub fans out change signals to its subscribers. Every subscriber owns a
// channel with a one-slot buffer; a signal is a non-blocking send, so signals
// merge while a subscriber is busy and a slow subscriber never holds up the
// others. Signalling is O(subscribers) and starts no goroutine.
type hub struct {
	mu   sync.Mutex
	subs notify.Set
}

// watch subscribes. The returned cancel is safe to call more than once.
func (h *hub) watch() (<-chan struct{}, func()) {
	h.mu.Lock()
	if h.subs == nil {
		h.subs = notify.Set{}
	}
	ch := h.subs.Add()
	h.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.subs.Remove(ch)
		})
	}
}

// notify signals every subscriber without blocking.
func (h *hub) notify() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subs.Signal()
}

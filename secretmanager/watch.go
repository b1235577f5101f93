package secretmanager

import (
	"sync"

	"github.com/meshagent/meshagent/internal/notify"
)

// hub fans out change signals to subscribers of a name. Every subscriber owns
// a channel with a one-slot buffer; a signal is a non-blocking send, so signals
// merge while a subscriber is busy and a slow subscriber never holds up the
// others. Signalling is O(subscribers of the name) and starts no goroutine.
type hub struct {
	mu   sync.Mutex
	subs map[string]notify.Set
}

// watch subscribes to name. The returned cancel is safe to call more than once.
func (h *hub) watch(name string) (<-chan struct{}, func()) {
	h.mu.Lock()
	if h.subs == nil {
		h.subs = make(map[string]notify.Set)
	}
	set := h.subs[name]
	if set == nil {
		set = notify.Set{}
		h.subs[name] = set
	}
	ch := set.Add()
	h.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if set := h.subs[name]; set != nil {
				set.Remove(ch)
				if len(set) == 0 {
					delete(h.subs, name)
				}
			}
		})
	}
}

// notify signals every subscriber of name without blocking.
func (h *hub) notify(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subs[name].Signal()
}

// count returns the number of subscribers of name.
func (h *hub) count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs[name])
}

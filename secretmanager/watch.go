package secretmanager

import "sync"

// hub fans out change signals to subscribers of a name. Every subscriber owns
// a channel with a one-slot buffer; a signal is a non-blocking send, so signals
// merge while a subscriber is busy and a slow subscriber never holds up the
// others. Signalling is O(subscribers of the name) and starts no goroutine.
type hub struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

// watch subscribes to name. The returned cancel is safe to call more than once.
func (h *hub) watch(name string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs == nil {
		h.subs = make(map[string]map[chan struct{}]struct{})
	}
	set := h.subs[name]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		h.subs[name] = set
	}
	set[ch] = struct{}{}
	h.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if set := h.subs[name]; set != nil {
				delete(set, ch)
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
	for ch := range h.subs[name] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// count returns the number of subscribers of name.
func (h *hub) count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs[name])
}

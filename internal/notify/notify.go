// Package notify is the change signal the agent's components use: a channel
// with a one-slot buffer and a non-blocking send. Signals merge while a
// receiver is busy (it reads the newest state once it looks), and a slow
// receiver never delays the sender or the other receivers. Nothing here
// starts a goroutine.
package notify

// Signal sends on ch without blocking; a signal already pending absorbs it.
func Signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Set is the channels of a thing's subscribers. It is not safe for
// concurrent use: its owner guards it with the lock of the state it signals.
type Set map[chan struct{}]struct{}

// Add makes a subscriber's channel (one-slot buffer), adds it and returns it.
func (s Set) Add() chan struct{} {
	ch := make(chan struct{}, 1)
	s[ch] = struct{}{}
	return ch
}

// Remove ends the subscription of ch.
func (s Set) Remove(ch chan struct{}) { delete(s, ch) }

// Signal signals every subscriber without blocking.
func (s Set) Signal() {
	for ch := range s {
		Signal(ch)
	}
}

package istioca

import (
	"context"
	"sync"

	"google.golang.org/grpc/status"
)

// hold keeps one call waiting until the test releases it.
type hold struct {
	arrived     chan struct{}
	release     chan struct{}
	releaseOnce sync.Once
}

// HoldNext makes the next CreateCertificate call to arrive wait, before it is
// judged, until release is called or its caller gives up: an answer that is
// slow for as long as the test wants and then given as usual. arrived is
// closed once that call has arrived. release is safe to call twice; a call still
// held ends when the server stops.
func (s *Server) HoldNext() (arrived <-chan struct{}, release func()) {
	h := &hold{arrived: make(chan struct{}), release: make(chan struct{})}
	s.mu.Lock()
	s.next = h
	s.mu.Unlock()
	return h.arrived, func() { h.releaseOnce.Do(func() { close(h.release) }) }
}

// takeHold returns the hold the arriving call must wait on, nil when none is
// set. It is called with s.mu held.
func (s *Server) takeHold() *hold {
	h := s.next
	if h != nil {
		s.next = nil
		close(h.arrived)
	}
	return h
}

// wait blocks until h is released or ctx ends; a nil h does not wait.
func (h *hold) wait(ctx context.Context) error {
	if h == nil {
		return nil
	}
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

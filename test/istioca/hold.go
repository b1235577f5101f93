package istioca

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
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

// RefuseIdentity makes every CreateCertificate call whose CSR asks for
// identity (a URI SAN) fail with code, whatever the mode, until the server
// stops; codes.OK lifts the refusal. Calls for other identities go on as
// before: a CA that refuses one workload and serves the others.
func (s *Server) RefuseIdentity(identity string, code codes.Code) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused == nil {
		s.refused = map[string]codes.Code{}
	}
	if code == codes.OK {
		delete(s.refused, identity)
		return
	}
	s.refused[identity] = code
}

// refusal returns the code a call for identity is refused with, if it is.
// It is called with s.mu held.
func (s *Server) refusal(identity string) (codes.Code, bool) {
	c, ok := s.refused[identity]
	return c, ok
}

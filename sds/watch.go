package sds

import (
	"context"

	"github.com/meshagent/meshagent/caller"
)

// watchKey names one shared watch: a resource name as seen by callers of
// one identity. A source's answer for a name depends on the caller's
// identity only (SecretSource), so streams of one identity share a watch.
type watchKey struct {
	identity string
	name     string
}

// sharedWatch is one subscription to the source, shared by every stream
// that serves its name to callers of its identity. Its goroutine waits for
// the source's signal and kicks each member stream; the streams themselves
// hold no goroutine while they wait. members and the fields below are
// guarded by Server.watchMu.
type sharedWatch struct {
	members map[*stream]struct{}
	cancel  func()        // ends the source's subscription
	stop    chan struct{} // closed when the last member leaves
}

// join adds st to the shared watch of key, subscribing to the source first
// when it is the first member: a change published after join returns kicks
// st. ctx is st's context (it carries the caller).
func (s *Server) join(ctx context.Context, key watchKey, st *stream) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if w := s.watches[key]; w != nil {
		w.members[st] = struct{}{}
		return
	}
	// The subscription outlives the stream that opened it: keep the
	// caller, drop the stream's cancellation.
	ch, cancel := s.cfg.Secrets.Watch(context.WithoutCancel(ctx), key.name)
	w := &sharedWatch{members: map[*stream]struct{}{st: {}}, cancel: cancel, stop: make(chan struct{})}
	if s.watches == nil {
		s.watches = make(map[watchKey]*sharedWatch)
	}
	s.watches[key] = w
	if ch != nil {
		go s.fanOut(w, ch)
	}
}

// leave removes st from the shared watch of key; the last member to leave
// ends the source's subscription and the watch's goroutine.
func (s *Server) leave(key watchKey, st *stream) {
	s.watchMu.Lock()
	w := s.watches[key]
	if w == nil {
		s.watchMu.Unlock()
		return
	}
	delete(w.members, st)
	if len(w.members) > 0 {
		s.watchMu.Unlock()
		return
	}
	delete(s.watches, key)
	s.watchMu.Unlock()
	close(w.stop)
	w.cancel()
}

// fanOut kicks every member of w each time the source signals a change.
// Kicking never blocks: each stream pushes on its own goroutine, so a slow
// client delays only itself.
func (s *Server) fanOut(w *sharedWatch, ch <-chan struct{}) {
	for {
		select {
		case <-w.stop:
			return
		case <-ch:
			s.watchMu.Lock()
			for st := range w.members {
				st.kick()
			}
			s.watchMu.Unlock()
		}
	}
}

// identityOf returns the caller identity ctx carries ("" for the agent's
// own).
func identityOf(ctx context.Context) string {
	info, _ := caller.FromContext(ctx)
	return info.Identity
}

package sds

import (
	"context"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/secretmanager"
)

// watchKey names one shared watch: a resource name as seen by callers of
// one identity. A source's answer for a name depends on the caller's
// identity only (SecretSource), so streams of one identity share a watch.
type watchKey struct {
	identity pki.Identity
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
	refused bool          // the source refused to watch the name (nil channel)
}

// join adds st to the shared watch of key, subscribing to the source first
// when it is the first member: a change published after join returns kicks
// st. It reports whether the
// source refused to watch the name, in which case the stream must refuse
// it too. A file resource over the caller's share is refused before the
// source is asked: the error is the stream's end.
func (s *Server) join(key watchKey, st *stream) (refused bool, err error) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if err := s.holdFileNameLocked(st, key.name); err != nil {
		return false, err
	}
	if w := s.watches[key]; w != nil {
		w.members[st] = struct{}{}
		return w.refused, nil
	}
	// The subscription outlives the stream that opened it.
	ch, cancel := s.cfg.Secrets.Watch(key.identity, key.name)
	w := &sharedWatch{members: map[*stream]struct{}{st: {}}, cancel: cancel, stop: make(chan struct{}), refused: ch == nil}
	if s.watches == nil {
		s.watches = make(map[watchKey]*sharedWatch)
	}
	s.watches[key] = w
	if ch != nil {
		go s.fanOut(w, ch)
	}
	return w.refused, nil
}

// isFileName reports whether name is a file resource, whose holds are
// bounded per caller.
func isFileName(name string) bool {
	return strings.HasPrefix(name, secretmanager.FileCertPrefix) || strings.HasPrefix(name, secretmanager.FileRootPrefix)
}

// holdFileNameLocked counts one more stream of st's caller holding name
// when it is a file resource, refusing a name the caller does not hold yet
// once it holds MaxFileNamesPerCaller of them. s.watchMu is held.
func (s *Server) holdFileNameLocked(st *stream, name string) error {
	if !isFileName(name) {
		return nil
	}
	held := s.fileNames[st.caller]
	if held[name] == 0 && len(held) >= s.cfg.MaxFileNamesPerCaller {
		s.metrics.refused.WithLabelValues(refusedFileNames).Inc()
		st.log.Warn("file resource refused: the caller holds its share already",
			zap.String(logkeys.Name, name), zap.String(logkeys.Caller, st.caller), zap.Int(logkeys.MaxFileNamesPerCaller, s.cfg.MaxFileNamesPerCaller))
		return status.Errorf(codes.ResourceExhausted,
			"resource %.200q refused: a caller holds at most %d file resources at once (MaxFileNamesPerCaller)",
			name, s.cfg.MaxFileNamesPerCaller)
	}
	if held == nil {
		held = make(map[string]int)
		if s.fileNames == nil {
			s.fileNames = make(map[string]map[string]int)
		}
		s.fileNames[st.caller] = held
	}
	held[name]++
	return nil
}

// releaseFileNameLocked undoes holdFileNameLocked. s.watchMu is held.
func (s *Server) releaseFileNameLocked(st *stream, name string) {
	held := s.fileNames[st.caller]
	if !isFileName(name) || held[name] == 0 {
		return
	}
	if held[name]--; held[name] == 0 {
		delete(held, name)
		if len(held) == 0 {
			delete(s.fileNames, st.caller)
		}
	}
}

// leave removes st from the shared watch of key; the last member to leave
// ends the source's subscription and the watch's goroutine.
func (s *Server) leave(key watchKey, st *stream) {
	s.watchMu.Lock()
	s.releaseFileNameLocked(st, key.name)
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

// callerKey names the caller of ctx for the per-caller bound on file
// resources: its pod when it was resolved to one, else its identity, else
// the process that connected (uid and pid); "" when ctx carries no caller.
func callerKey(ctx context.Context) string {
	info, ok := caller.FromContext(ctx)
	if !ok {
		return ""
	}
	if k := info.Key(); k != "" {
		return k
	}
	return "uid:" + strconv.FormatUint(uint64(info.Cred.UID), 10) + " pid:" + strconv.FormatInt(int64(info.Cred.PID), 10)
}

// identityOf returns the caller identity ctx carries, as the socket server
// resolved it (zero for the agent's own): the one place sds reads it.
func identityOf(ctx context.Context) pki.Identity {
	info, _ := caller.FromContext(ctx)
	return info.Identity
}

package udsserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

// LimitNames are what the limits' refusals name as the bound to raise (the
// settings that configure them, given by the composition root), so a
// refused caller, and whoever reads its logs, knows which one. Empty names
// none.
type LimitNames struct {
	ConnsPerCaller, ConnRatePerCaller, UnaryPerCaller, QueuedPerCaller string
}

// named is " (name)", or nothing without a name.
func named(name string) string {
	if name == "" {
		return ""
	}
	return " (" + name + ")"
}

// callerKey names who a connection counts against: its pod, or the uid of
// a process outside any pod (node processes, a sidecar's callers). A
// connection whose pod is not known yet counts against the pod its cgroup
// names (caller.PodOf), so that it shares no bucket with other pods.
func callerKey(info caller.Info, cred caller.Cred) string {
	if info.PodUID != "" {
		return podKey(info.PodUID)
	}
	return uidKey(cred)
}

func uidKey(cred caller.Cred) string { return "uid:" + strconv.FormatUint(uint64(cred.UID), 10) }

// connKey is the caller key c counts against, for the logs: its group's
// when it counts against none.
func connKey(c *conn) string {
	if st := c.state.Load(); st != nil {
		return st.key
	}
	if c.group != "" {
		return c.group
	}
	return uidKey(c.cred)
}

func podKey(uid string) string { return "pod:" + uid }

// callerState is what one caller holds across its connections.
type callerState struct {
	key    string                  // the caller's key, as in callers.m
	conns  map[*conn]struct{}      // guarded by callers.mu
	unary  atomic.Int64            // unary calls being served
	queued atomic.Int64            // response bytes handed to gRPC, not yet written
	gone   atomic.Pointer[gonePod] // set when the pod left: its connections are refused
}

// gonePod is why a caller's connections are refused from now on.
type gonePod struct{ err error }

// callers counts connections, unary calls and queued bytes per caller.
type callers struct {
	mu sync.Mutex
	m  map[string]*callerState
	// limitName names the bound in join's refusals (LimitNames.ConnsPerCaller).
	limitName string
}

// join counts c against key, or returns a ResourceExhausted status when key
// holds max connections already.
func (cs *callers) join(c *conn, key string, max int) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st := cs.m[key]
	if st == nil {
		st = &callerState{key: key, conns: map[*conn]struct{}{}}
		cs.m[key] = st
	}
	if len(st.conns) >= max {
		return status.Errorf(codes.ResourceExhausted,
			"too many connections from this caller: at most %d are open at once%s", max, named(cs.limitName))
	}
	st.conns[c] = struct{}{}
	c.key = key
	c.state.Store(st)
	return nil
}

// leave stops counting c, giving back what it has queued.
func (cs *callers) leave(c *conn) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st := c.state.Load()
	if st == nil {
		return
	}
	delete(st.conns, c)
	st.queued.Add(-c.queued.Swap(0))
	if len(st.conns) == 0 && cs.m[c.key] == st {
		delete(cs.m, c.key)
	}
	c.key = ""
	c.state.Store(nil)
}

// move counts c against key instead of its current caller (a connection
// identified after it was accepted).
func (cs *callers) move(c *conn, key string, max int) error {
	cs.mu.Lock()
	oldKey := c.key
	cs.mu.Unlock()
	if oldKey == key {
		return nil
	}
	cs.leave(c)
	if err := cs.join(c, key, max); err != nil {
		// Back where it was, over any limit: it was counted there already.
		cs.mu.Lock()
		st := cs.m[oldKey]
		if st == nil {
			st = &callerState{key: oldKey, conns: map[*conn]struct{}{}}
			cs.m[oldKey] = st
		}
		st.conns[c] = struct{}{}
		c.key = oldKey
		c.state.Store(st)
		cs.mu.Unlock()
		return err
	}
	return nil
}

// connsOf returns the connections counted against key.
func (cs *callers) connsOf(key string) []*conn {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st := cs.m[key]
	if st == nil {
		return nil
	}
	out := make([]*conn, 0, len(st.conns))
	for c := range st.conns {
		out = append(out, c)
	}
	return out
}

// leaveAll marks key gone with err and returns its connections.
func (cs *callers) leaveAll(key string, err error) []*conn {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st := cs.m[key]
	if st == nil {
		return nil
	}
	st.gone.Store(&gonePod{err: err})
	delete(cs.m, key) // a new connection of the key starts afresh
	out := make([]*conn, 0, len(st.conns))
	for c := range st.conns {
		out = append(out, c)
	}
	return out
}

// grpcMessagePrefix is gRPC's header of each message in DATA frames
// (compression flag, length).
const grpcMessagePrefix = 5

// wireSize is the size of a message gRPC is about to send, as DATA
// payload.
func wireSize(m any) int64 {
	switch v := m.(type) {
	case WireMessage:
		return grpcMessagePrefix + int64(v.WireBuffers().Len())
	case proto.Message:
		return grpcMessagePrefix + int64(proto.Size(v))
	}
	return 0
}

// admit decides whether an RPC is served and returns its context carrying
// the caller (caller.NewContext). A uid outside AllowedUIDs, unknown peer
// credentials when they are needed, or a caller the Resolver refuses get
// PermissionDenied naming the reason.
func (s *Server) admit(ctx context.Context, method string) (context.Context, error) {
	c, ok := connOf(ctx)
	if ok {
		if st := c.state.Load(); st != nil {
			if g := st.gone.Load(); g != nil {
				s.metrics.refused.WithLabelValues(refusedGone).Inc()
				return nil, g.err
			}
		}
	}
	credOK := ok && c.credOK
	if len(s.cfg.AllowedUIDs) > 0 {
		if !credOK {
			s.metrics.refused.WithLabelValues(refusedUID).Inc()
			s.log.Warn("local client refused: peer credentials unknown", zap.String(logkeys.Method, method))
			return nil, status.Error(codes.PermissionDenied, "peer credentials unknown; only allowed uids may use this socket")
		}
		if !slices.Contains(s.cfg.AllowedUIDs, c.cred.UID) {
			s.metrics.refused.WithLabelValues(refusedUID).Inc()
			err := status.Errorf(codes.PermissionDenied, "peer uid %d is not allowed to use this socket", c.cred.UID)
			s.refusals.log(uidKey(c.cred), refusedUID, c.cred, status.Convert(err).Message())
			return nil, err
		}
	}
	if s.cfg.Resolver == nil {
		if !credOK {
			// No caller in the context: nothing can be decided from it.
			return ctx, nil
		}
		return caller.NewContext(ctx, caller.Info{Cred: c.cred}), nil
	}
	if !credOK {
		s.metrics.refused.WithLabelValues(refusedUnresolved).Inc()
		s.log.Warn("local client refused: peer credentials unknown", zap.String(logkeys.Method, method))
		return nil, status.Error(codes.PermissionDenied, "peer credentials unknown; the caller cannot be identified")
	}
	info, err := c.resolve(ctx, s.cfg.Resolver)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, status.FromContextError(err).Err()
		}
		s.metrics.refused.WithLabelValues(refusedUnresolved).Inc()
		msg := fmt.Sprintf("caller not identified: %v", err)
		s.refusals.log(connKey(c), refusedUnresolved, c.cred, msg)
		return nil, status.Error(codes.PermissionDenied, msg)
	}
	// Identified after it was accepted: counted against its pod from now.
	if err := s.callers.move(c, callerKey(info, c.cred), s.cfg.MaxConnsPerCaller); err != nil {
		s.metrics.refused.WithLabelValues(refusedConnections).Inc()
		return nil, err
	}
	return caller.NewContext(ctx, info), nil
}

// reserve counts a response of m against its connection's caller, or
// refuses it when the caller's queued responses are over the limit.
func (s *Server) reserve(c *conn, m any) error {
	st := c.state.Load()
	if st == nil {
		return nil
	}
	if q := st.queued.Load(); q > int64(s.cfg.MaxQueuedBytesPerCaller) {
		s.metrics.refused.WithLabelValues(refusedQueued).Inc()
		s.log.Debug("local client refused: responses queued", zap.Stringer(logkeys.Cred, c.cred), zap.Int64(logkeys.MaxQueuedBytes, q))
		return status.Errorf(codes.ResourceExhausted,
			"too many response bytes queued for this caller: at most %d until it reads them%s",
			s.cfg.MaxQueuedBytesPerCaller, named(s.cfg.LimitNames.QueuedPerCaller))
	}
	c.queue(wireSize(m))
	return nil
}

func (s *Server) unaryAdmit(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, err := s.admit(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	c, ok := connOf(ctx)
	if !ok {
		return h(ctx, req)
	}
	st := c.state.Load()
	if st != nil {
		if n := st.unary.Add(1); n > int64(s.cfg.MaxUnaryPerCaller) {
			st.unary.Add(-1)
			s.metrics.refused.WithLabelValues(refusedUnary).Inc()
			s.log.Debug("local client refused: too many unary calls", zap.Stringer(logkeys.Cred, c.cred), zap.Int(logkeys.MaxUnary, s.cfg.MaxUnaryPerCaller))
			return nil, status.Errorf(codes.ResourceExhausted,
				"too many calls from this caller: at most %d are served at once%s", s.cfg.MaxUnaryPerCaller, named(s.cfg.LimitNames.UnaryPerCaller))
		}
		defer st.unary.Add(-1)
	}
	if err := s.reserve(c, nil); err != nil {
		return nil, err
	}
	resp, err := h(ctx, req)
	if err == nil {
		c.queue(wireSize(resp))
	}
	return resp, err
}

func (s *Server) streamAdmit(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, err := s.admit(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	c, ok := connOf(ctx)
	if !ok {
		return h(srv, callerStream{ServerStream: ss, ctx: ctx})
	}
	// The stream ends when its caller leaves (CallerLeft), with the reason.
	c.addStream(ss.Context())
	defer c.removeStream(ss.Context())
	err = h(srv, callerStream{ServerStream: ss, ctx: ctx, s: s, c: c})
	if st := c.state.Load(); st != nil {
		if g := st.gone.Load(); g != nil {
			return g.err
		}
	}
	return err
}

// callerStream is a server stream whose context carries the caller and
// whose responses count against the caller's queued bytes.
type callerStream struct {
	grpc.ServerStream
	ctx context.Context
	s   *Server
	c   *conn // nil: not counted
}

func (cs callerStream) Context() context.Context { return cs.ctx }

func (cs callerStream) SendMsg(m any) error {
	if cs.c == nil {
		return cs.ServerStream.SendMsg(m)
	}
	if err := cs.s.reserve(cs.c, m); err != nil {
		return err
	}
	return cs.ServerStream.SendMsg(m)
}

// CallerLeft ends the connections of the pod with podUID: their streams
// end, and every call on them is refused, with PermissionDenied naming
// why; the connections are closed shortly after. Node mode calls it when a
// pod is deleted or has finished.
func (s *Server) CallerLeft(podUID, why string) {
	err := status.Errorf(codes.PermissionDenied, "caller refused: its pod %s", why)
	conns := s.callers.leaveAll(podKey(podUID), err)
	if len(conns) == 0 {
		return
	}
	s.log.Info("pod left: its connections are closed", zap.String(logkeys.Caller, podKey(podUID)), zap.String(logkeys.Reason, why),
		zap.Int(logkeys.Connections, len(conns)))
	for _, c := range conns {
		c.endStreams(err)
		if c.closeConn != nil {
			time.AfterFunc(refusedGrace, c.closeConn)
		}
	}
}

// CallerArrived resolves again, now, the connections counted against the
// pod with podUID that were accepted before the pod was known (their
// cgroup named it; node mode calls this when its pod index learns of a
// pod): they are then the pod's, and hold no pidfd. One whose caller is
// now refused for good is closed. A connection another RPC is resolving
// is left to it.
func (s *Server) CallerArrived(podUID string) {
	if s.cfg.Resolver == nil {
		return
	}
	for _, c := range s.callers.connsOf(podKey(podUID)) {
		ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
		info, err := c.tryResolve(ctx, s.cfg.Resolver)
		cancel()
		switch {
		case err == nil:
			if err := s.callers.move(c, callerKey(info, c.cred), s.cfg.MaxConnsPerCaller); err != nil {
				s.metrics.refused.WithLabelValues(refusedConnections).Inc()
			}
		case errors.Is(err, errResolving) || caller.IsTemporary(err):
		default:
			msg := fmt.Sprintf("caller not identified: %v", err)
			s.metrics.refused.WithLabelValues(refusedUnresolved).Inc()
			s.refusals.log(podKey(podUID), refusedUnresolved, c.cred, msg)
			if c.closeConn != nil {
				c.closeConn()
			}
		}
	}
}

// streamEnd ends a stream being served before its handler returns: the
// stream's context, as gRPC made it, holds gRPC's transport stream.
type streamEnd struct{ ctx context.Context }

// statusWriter is what gRPC's transport stream (in a stream's context)
// offers to end it with a status: its context is canceled, the handler's
// blocked RecvMsg returns, and the status the handler returns later is not
// sent.
type statusWriter interface {
	WriteStatus(st *status.Status) error
}

// end ends the stream with err's status now, when gRPC's stream allows it;
// otherwise the stream ends when the connection is closed.
func (e streamEnd) end(err error) {
	if w, ok := grpc.ServerTransportStreamFromContext(e.ctx).(statusWriter); ok {
		_ = w.WriteStatus(status.Convert(err))
	}
}

// written takes n bytes written to the socket off what is queued.
func (c *conn) written(n int64) {
	for {
		q := c.queued.Load()
		d := min(q, n)
		if d <= 0 {
			return
		}
		if c.queued.CompareAndSwap(q, q-d) {
			if st := c.state.Load(); st != nil {
				st.queued.Add(-d)
			}
			return
		}
	}
}

// queue counts n bytes handed to gRPC for sending.
func (c *conn) queue(n int64) {
	c.queued.Add(n)
	if st := c.state.Load(); st != nil {
		st.queued.Add(n)
	}
}

// addStream records a stream being served.
func (c *conn) addStream(ctx context.Context) {
	c.streamsMu.Lock()
	defer c.streamsMu.Unlock()
	c.streams = append(c.streams, streamEnd{ctx: ctx})
}

func (c *conn) removeStream(ctx context.Context) {
	c.streamsMu.Lock()
	defer c.streamsMu.Unlock()
	for i, e := range c.streams {
		if e.ctx == ctx {
			last := len(c.streams) - 1
			c.streams[i] = c.streams[last]
			c.streams[last] = streamEnd{}
			c.streams = c.streams[:last]
			return
		}
	}
}

// endStreams ends every stream being served with err.
func (c *conn) endStreams(err error) {
	c.streamsMu.Lock()
	defer c.streamsMu.Unlock()
	for _, e := range c.streams {
		e.end(err)
	}
}

// refusedGrace is how long a connection of a pod that left stays open, for
// its RPCs to be told why.
const refusedGrace = 2 * time.Second

// slots bound what connections hold at one step of their handshake (being
// identified, Config.MaxHandshakes; refused and waiting for their client's
// call, maxAwaiting), in all and per group, so that one pod cannot take
// them all. Not an x/sync semaphore: a Weighted holds one count and never
// refuses at once by key; the total and a group's share are checked under
// one lock here (streamlimit counts streams the same way).
type slots struct {
	mu    sync.Mutex
	total int
	per   map[string]int
}

// acquire takes a slot of group, or reports false when the group holds
// share of them or all hold max.
func (s *slots) acquire(group string, max, share int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total >= max || s.per[group] >= share {
		return false
	}
	if s.per == nil {
		s.per = map[string]int{}
	}
	s.total++
	s.per[group]++
	return true
}

func (s *slots) release(group string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.per[group]--; s.per[group] <= 0 {
		delete(s.per, group)
	}
}

// count is the slots group holds.
func (s *slots) count(group string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.per[group]
}

// handshakeShares: one group holds at most 1/handshakeShares of
// Config.MaxHandshakes (at least one): an identification takes tens of
// microseconds, so that many pods flooding at once are needed to keep
// another pod's connection waiting, not one.
const handshakeShares = 8

func handshakeShare(total int) int { return max(1, total/handshakeShares) }

// connRate is a token bucket (x/time/rate) per caller key: a caller may
// open burst connections at once, then perSec a second. Buckets are swept
// past rateSweepAt callers, so a Limiter (96 bytes) per key stays bounded.
type connRate struct {
	perSec rate.Limit
	burst  int
	mu     sync.Mutex
	m      map[string]*rate.Limiter
}

func newConnRate(perSec, burst int) *connRate {
	return &connRate{perSec: rate.Limit(perSec), burst: burst, m: map[string]*rate.Limiter{}}
}

// rateSweepAt is the number of buckets above which full ones are dropped
// (a full bucket is what a new one would be).
const rateSweepAt = 1024

// allow takes a token of key's bucket, or reports false when it is empty.
func (r *connRate) allow(key string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.m[key]
	if l == nil {
		if len(r.m) >= rateSweepAt {
			r.sweep(now)
		}
		l = rate.NewLimiter(r.perSec, r.burst)
		r.m[key] = l
	}
	return l.AllowN(now, 1)
}

func (r *connRate) sweep(now time.Time) {
	for k, l := range r.m {
		if l.TokensAt(now) >= float64(r.burst) {
			delete(r.m, k)
		}
	}
}

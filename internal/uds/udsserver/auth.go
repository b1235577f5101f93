package udsserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

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
			"too many response bytes queued for this caller: at most %d until it reads them (%s)",
			s.cfg.MaxQueuedBytesPerCaller, SettingMaxQueuedPerCaller)
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
				"too many calls from this caller: at most %d are served at once (%s)", s.cfg.MaxUnaryPerCaller, SettingMaxUnaryPerCaller)
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

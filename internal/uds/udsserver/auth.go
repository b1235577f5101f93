package udsserver

import (
	"context"
	"errors"
	"slices"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/uds/caller"
)

// admit decides whether an RPC is served and returns its context carrying
// the caller (caller.NewContext). A uid outside AllowedUIDs, unknown peer
// credentials when they are needed, or a caller the Resolver refuses get
// PermissionDenied naming the reason.
func (s *Server) admit(ctx context.Context, method string) (context.Context, error) {
	c, ok := connOf(ctx)
	credOK := ok && c.credOK
	if len(s.cfg.AllowedUIDs) > 0 {
		if !credOK {
			s.metrics.refused.WithLabelValues(refusedUID).Inc()
			s.log.Warn("local client refused: peer credentials unknown", zap.String(keyMethod, method))
			return nil, status.Error(codes.PermissionDenied, "peer credentials unknown; only allowed uids may use this socket")
		}
		if !slices.Contains(s.cfg.AllowedUIDs, c.cred.UID) {
			s.metrics.refused.WithLabelValues(refusedUID).Inc()
			s.log.Warn("local client refused: uid not allowed", zap.String(keyMethod, method),
				zap.Uint32(keyUID, c.cred.UID), zap.Uint32(keyGID, c.cred.GID), zap.Int32(keyPID, c.cred.PID))
			return nil, status.Errorf(codes.PermissionDenied, "peer uid %d is not allowed to use this socket", c.cred.UID)
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
		s.log.Warn("local client refused: peer credentials unknown", zap.String(keyMethod, method))
		return nil, status.Error(codes.PermissionDenied, "peer credentials unknown; the caller cannot be identified")
	}
	info, err := c.resolve(ctx, s.cfg.Resolver)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, status.FromContextError(err).Err()
		}
		s.metrics.refused.WithLabelValues(refusedUnresolved).Inc()
		s.log.Warn("local client refused: caller not resolved", zap.String(keyMethod, method),
			zap.Uint32(keyUID, c.cred.UID), zap.Int32(keyPID, c.cred.PID), zap.Error(err))
		return nil, status.Errorf(codes.PermissionDenied, "caller not identified: %v", err)
	}
	return caller.NewContext(ctx, info), nil
}

func (s *Server) unaryAdmit(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, err := s.admit(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) streamAdmit(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, err := s.admit(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return h(srv, callerStream{ServerStream: ss, ctx: ctx})
}

// callerStream is a server stream whose context carries the caller.
type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c callerStream) Context() context.Context { return c.ctx }

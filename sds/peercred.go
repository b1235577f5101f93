package sds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// PeerCred is the identity of the process at the other end of a Unix socket
// connection, as the kernel reports it (SO_PEERCRED) when it connected.
type PeerCred struct {
	UID, GID uint32
	PID      int32
}

// String formats the credentials as uid=.. gid=.. pid=...
func (p PeerCred) String() string {
	return "uid=" + strconv.FormatUint(uint64(p.UID), 10) + " gid=" + strconv.FormatUint(uint64(p.GID), 10) +
		" pid=" + strconv.FormatInt(int64(p.PID), 10)
}

// errNoPeerCred is returned when the connection's peer credentials cannot be
// read (not a Unix socket, or a platform without SO_PEERCRED).
var errNoPeerCred = errors.New("peer credentials are not available")

// peerAuthInfo is the credentials.AuthInfo of an SDS connection.
type peerAuthInfo struct {
	credentials.CommonAuthInfo
	cred PeerCred
	ok   bool // false when cred could not be read
}

func (peerAuthInfo) AuthType() string { return "peercred" }

// peerCreds is a TransportCredentials that adds no security (the socket is
// local) but reads the peer's uid, gid and pid on every new connection and
// logs them.
type peerCreds struct {
	log *zap.Logger
}

func (c peerCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := peerAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}
	uc, isUnix := conn.(*net.UnixConn)
	if !isUnix {
		c.log.Warn("SDS client connected; peer credentials not read", zap.Error(errNoPeerCred))
		return conn, info, nil
	}
	cred, err := readPeerCred(uc)
	if err != nil {
		c.log.Warn("SDS client connected; peer credentials not read", zap.Error(err))
		return conn, info, nil
	}
	info.cred, info.ok = cred, true
	c.log.Info("SDS client connected", zap.Uint32(keyUID, cred.UID), zap.Uint32(keyGID, cred.GID), zap.Int32(keyPID, cred.PID))
	return conn, info, nil
}

func (peerCreds) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return conn, peerAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}

func (c peerCreds) Clone() credentials.TransportCredentials { return c }

func (peerCreds) OverrideServerName(string) error { return nil }

// PeerCredFromContext returns the peer credentials of the connection that
// carries an RPC served by the SDS server.
func PeerCredFromContext(ctx context.Context) (PeerCred, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return PeerCred{}, false
	}
	info, ok := p.AuthInfo.(peerAuthInfo)
	if !ok || !info.ok {
		return PeerCred{}, false
	}
	return info.cred, true
}

// authorize refuses with PermissionDenied a peer whose uid is not in
// AllowedUIDs; an empty list lets everyone in.
func (s *Server) authorize(ctx context.Context) error {
	if len(s.cfg.AllowedUIDs) == 0 {
		return nil
	}
	cred, ok := PeerCredFromContext(ctx)
	if !ok {
		s.metrics.refused.WithLabelValues(refusedUID).Inc()
		s.log.Warn("SDS client refused: peer credentials unknown")
		return status.Error(codes.PermissionDenied, "SDS peer credentials unknown; only allowed uids may connect")
	}
	if !slices.Contains(s.cfg.AllowedUIDs, cred.UID) {
		s.metrics.refused.WithLabelValues(refusedUID).Inc()
		s.log.Warn("SDS client refused: uid not allowed",
			zap.Uint32(keyUID, cred.UID), zap.Uint32(keyGID, cred.GID), zap.Int32(keyPID, cred.PID))
		return status.Error(codes.PermissionDenied, fmt.Sprintf("SDS peer uid %d is not allowed", cred.UID))
	}
	return nil
}

func (s *Server) unaryAuth(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) streamAuth(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.authorize(ss.Context()); err != nil {
		return err
	}
	return h(srv, ss)
}

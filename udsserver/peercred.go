package udsserver

import (
	"context"
	"errors"
	"net"

	"go.uber.org/zap"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/meshagent/meshagent/caller"
)

// errNoPeerCred is returned when the connection's peer credentials cannot be
// read (not a Unix socket, or a platform without SO_PEERCRED).
var errNoPeerCred = errors.New("peer credentials are not available")

// conn is what the server knows of one client connection: the kernel's
// credentials, read once when it connected, and the caller they resolved
// to, once a Resolver has been asked.
type conn struct {
	cred   caller.Cred
	credOK bool // false when cred could not be read

	// lock is a one-slot semaphore, so an RPC waiting for another RPC's
	// resolution on the same connection can give up when its context ends.
	lock     chan struct{}
	resolved bool
	info     caller.Info
}

func newConn() *conn { return &conn{lock: make(chan struct{}, 1)} }

// resolve returns the connection's caller, asking r the first time. A
// failure is not kept: the next RPC on the connection asks again (in node
// mode a pod may not be known yet when its first process connects).
func (c *conn) resolve(ctx context.Context, r caller.Resolver) (caller.Info, error) {
	select {
	case c.lock <- struct{}{}:
	case <-ctx.Done():
		return caller.Info{}, ctx.Err()
	}
	defer func() { <-c.lock }()
	if c.resolved {
		return c.info, nil
	}
	info, err := r.Resolve(ctx, c.cred)
	if err != nil {
		return caller.Info{}, err
	}
	info.Cred = c.cred // the kernel's answer, whatever the resolver filled in
	c.info, c.resolved = info, true
	return info, nil
}

// authInfo is the credentials.AuthInfo of a connection to the server.
type authInfo struct {
	credentials.CommonAuthInfo
	conn *conn
}

func (authInfo) AuthType() string { return "peercred" }

// peerCreds is a TransportCredentials that adds no security (the socket is
// local) but reads the peer's uid, gid and pid on every new connection and
// logs them.
type peerCreds struct {
	log *zap.Logger
}

func (c peerCreds) ServerHandshake(nc net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := authInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, conn: newConn()}
	uc, isUnix := nc.(*net.UnixConn)
	if !isUnix {
		c.log.Warn("local client connected; peer credentials not read", zap.Error(errNoPeerCred))
		return nc, info, nil
	}
	cred, err := readPeerCred(uc)
	if err != nil {
		c.log.Warn("local client connected; peer credentials not read", zap.Error(err))
		return nc, info, nil
	}
	info.conn.cred, info.conn.credOK = cred, true
	c.log.Info("local client connected", zap.Uint32(keyUID, cred.UID), zap.Uint32(keyGID, cred.GID), zap.Int32(keyPID, cred.PID))
	return nc, info, nil
}

func (peerCreds) ClientHandshake(_ context.Context, _ string, nc net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nc, authInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}

func (c peerCreds) Clone() credentials.TransportCredentials { return c }

func (peerCreds) OverrideServerName(string) error { return nil }

// connOf returns the server's record of the connection carrying an RPC.
func connOf(ctx context.Context) (*conn, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, false
	}
	info, ok := p.AuthInfo.(authInfo)
	if !ok || info.conn == nil {
		return nil, false
	}
	return info.conn, true
}

package udsserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"go.uber.org/zap"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/meshagent/meshagent/internal/node/peerpidfd"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

// errNoPeerCred is returned when the connection's peer credentials cannot be
// read (not a Unix socket, or a platform without SO_PEERCRED).
var errNoPeerCred = errors.New("peer credentials are not available")

// conn is what the server knows of one client connection: the kernel's
// credentials and a pidfd of the connecting process, read once when it
// connected, and the caller they resolved to, once a Resolver has been asked.
type conn struct {
	cred   caller.Cred
	credOK bool // false when cred could not be read

	// pidfd pins the process that connected, so a resolver can tell when
	// the pid of cred no longer names it. fdMu guards pidfd, fdUsers and
	// fdClosed: the fd is closed when the connection closes and no
	// resolution is using it, so a resolver never reads an fd number that
	// was closed and handed to another file.
	fdMu     sync.Mutex
	pidfd    int // -1 when none
	pidfdErr error
	fdUsers  int
	fdClosed bool

	// lock is a one-slot semaphore, so an RPC waiting for another RPC's
	// resolution on the same connection can give up when its context ends.
	lock     chan struct{}
	resolved bool
	info     caller.Info
}

func newConn() *conn { return &conn{lock: make(chan struct{}, 1), pidfd: -1} }

// acquirePIDFD returns the connection's pidfd, held open until
// releasePIDFD; -1 when there is none or the connection has closed.
func (c *conn) acquirePIDFD() int {
	c.fdMu.Lock()
	defer c.fdMu.Unlock()
	if c.fdClosed || c.pidfd < 0 {
		return -1
	}
	c.fdUsers++
	return c.pidfd
}

func (c *conn) releasePIDFD() {
	c.fdMu.Lock()
	defer c.fdMu.Unlock()
	c.fdUsers--
	c.closeIfUnused()
}

// closePIDFD is called when the connection closes; the fd is closed now,
// or by the last resolution still using it.
func (c *conn) closePIDFD() {
	c.fdMu.Lock()
	defer c.fdMu.Unlock()
	c.fdClosed = true
	c.closeIfUnused()
}

func (c *conn) closeIfUnused() {
	if c.fdClosed && c.fdUsers == 0 && c.pidfd >= 0 {
		_ = syscall.Close(c.pidfd)
		c.pidfd = -1
	}
}

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
	if c.pidfdErr != nil && !errors.Is(c.pidfdErr, syscall.ENOSYS) {
		// The connecting process could not be pinned when it connected (it
		// may have exited already): its pid may name another process now.
		return caller.Info{}, fmt.Errorf("the connecting process (pid %d) could not be pinned: %w", c.cred.PID, c.pidfdErr)
	}
	fd := c.acquirePIDFD()
	if fd >= 0 {
		defer c.releasePIDFD()
		ctx = peerpidfd.NewContext(ctx, fd)
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
	if fd, err := peerpidfd.FromConn(uc); err != nil {
		info.conn.pidfdErr = err
		c.log.Warn("local client connected; its process could not be pinned", zap.Int32(keyPID, cred.PID), zap.Error(err))
	} else {
		info.conn.pidfd = fd
		nc = newPinnedConn(uc, info.conn)
	}
	c.log.Info("local client connected", zap.Uint32(keyUID, cred.UID), zap.Uint32(keyGID, cred.GID), zap.Int32(keyPID, cred.PID))
	return nc, info, nil
}

// pinnedConn is a connection holding a pidfd of its peer, closed with it.
//
// Wrapping the socket hides it from gRPC, which reads a bare *net.UnixConn
// only when data is there, into a buffer taken from a pool for that read,
// instead of keeping a read buffer per connection while it waits. On Linux
// pinnedConn reads the same way (ReadOnReady), so an idle connection holds
// no read buffer: with one connection per pod in node mode, that is 4 KiB
// per pod.
type pinnedConn struct {
	net.Conn
	c    *conn
	once sync.Once
	rd   readyRead // used by gRPC's reading goroutine only
}

func newPinnedConn(uc *net.UnixConn, c *conn) *pinnedConn {
	p := &pinnedConn{Conn: uc, c: c}
	p.rd.init(uc)
	return p
}

func (p *pinnedConn) Close() error {
	err := p.Conn.Close()
	p.once.Do(p.c.closePIDFD)
	return err
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

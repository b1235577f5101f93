package udsserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/logkeys"
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

	// lock guards the resolution, so an RPC waiting for another RPC's
	// resolution on the same connection can give up when its context ends.
	lock     *semaphore.Weighted
	resolved bool
	info     caller.Info

	// group is what the connection counted against before its caller was
	// known (see groupOf), for the logs.
	group string
	// key and state are the caller the connection counts against (see
	// callers); key is guarded by callers.mu.
	key    string
	state  atomic.Pointer[callerState]
	queued atomic.Int64 // response bytes handed to gRPC, not yet written

	streamsMu sync.Mutex
	streams   []streamEnd // the streams being served (usually one or two)
	closeConn func()      // closes the connection; set at accept
}

func newConn() *conn { return &conn{lock: semaphore.NewWeighted(1), pidfd: -1} }

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

// closePIDFD closes the pidfd once the caller is resolved or the connection
// closes: now, or by the last resolution still using it.
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
	if !c.lockResolve(ctx) {
		return caller.Info{}, ctx.Err()
	}
	defer c.unlockResolve()
	return c.resolveLocked(ctx, r)
}

// lockResolve takes the connection's resolution lock, or reports false
// when ctx ends first.
func (c *conn) lockResolve(ctx context.Context) bool {
	return c.lock.Acquire(ctx, 1) == nil
}

// tryLockResolve takes the resolution lock if no one holds it.
func (c *conn) tryLockResolve() bool { return c.lock.TryAcquire(1) }

func (c *conn) unlockResolve() { c.lock.Release(1) }

// errResolving: another RPC of the connection is resolving its caller.
var errResolving = errors.New("the caller is being resolved")

// tryResolve is resolve when no one else is resolving the connection's
// caller; errResolving otherwise.
func (c *conn) tryResolve(ctx context.Context, r caller.Resolver) (caller.Info, error) {
	if !c.tryLockResolve() {
		return caller.Info{}, errResolving
	}
	defer c.unlockResolve()
	return c.resolveLocked(ctx, r)
}

func (c *conn) resolveLocked(ctx context.Context, r caller.Resolver) (caller.Info, error) {
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
	// Pinned: the connection is the caller's for its life, the pidfd is no
	// longer needed (closed now, or by the deferred release).
	c.closePIDFD()
	return info, nil
}

// authInfo is the credentials.AuthInfo of a connection to the server.
type authInfo struct {
	credentials.CommonAuthInfo
	conn *conn
}

func (authInfo) AuthType() string { return "peercred" }

// peerCreds is a TransportCredentials that adds no security (the socket is
// local) but identifies the caller of every new connection (SO_PEERCRED, a
// pidfd, the Resolver) and counts the connection against its caller.
type peerCreds struct {
	s *Server
}

// resolveTimeout bounds a caller's resolution at accept (the resolver's own
// wait for a pod is shorter).
const resolveTimeout = 10 * time.Second

// ServerHandshake identifies the caller of a new connection and, when it
// is let in, parks the connection until its first request (see park). A
// connection refused here never gets a transport (see refuse.go).
// Identifying runs deep (the resolver, the logs) and on a goroutine of its
// own: the stack of this goroutine, which waits while the connection is
// parked, then stays at 4 KB instead of 8.
func (p peerCreds) ServerHandshake(nc net.Conn) (net.Conn, credentials.AuthInfo, error) {
	var (
		conn    net.Conn
		info    authInfo
		parking *localConn
		err     error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, info, parking, err = p.s.identify(nc)
	}()
	<-done
	if err != nil {
		return nil, nil, io.EOF // closed already; gRPC closes it again without logging
	}
	if parking != nil {
		if err := p.s.park(parking); err != nil {
			p.s.parkEnded(parking, err)
			return nil, nil, io.EOF // gRPC closes the connection without logging
		}
	}
	return conn, info, nil
}

// parkEnded closes a connection that ended while parked.
func (s *Server) parkEnded(lc *localConn, err error) {
	_ = lc.Close()
	s.log.Debug("local client connection ended before its first request", zap.Int32(logkeys.PID, lc.c.cred.PID), zap.Error(err))
}

// identify identifies the caller of nc and counts the connection against
// it. It returns the connection to serve and its AuthInfo, and the
// connection to park when the caller is let in; errRefusedAtHandshake when
// nc was refused (and closed).
//
// In order, each step cheaper than the next: the connection's group
// (groupOf) and its connection rate (Config.MaxConnRatePerCaller: the
// group is the caller's pod, or its uid outside pods), a slot of the
// handshakes in flight (Config.MaxHandshakes, shared among groups), the
// caller (a pidfd, the Resolver, which does not wait for a pod here) and
// the caller's connections (Config.MaxConnsPerCaller). The slot is given back before a refusal is
// told (tell): a refused connection holds no more than its share of the
// refusals waiting for their client's call.
func (s *Server) identify(nc net.Conn) (net.Conn, authInfo, *localConn, error) {
	c := newConn()
	info := authInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, conn: c}
	uc, isUnix := nc.(*net.UnixConn)
	if !isUnix {
		s.log.Warn("local client connected; peer credentials not read", zap.Error(errNoPeerCred))
		return nc, info, nil, nil
	}
	cred, err := readPeerCred(uc)
	if err != nil {
		s.log.Warn("local client connected; peer credentials not read", zap.Error(err))
		return nc, info, nil, nil
	}
	c.cred, c.credOK = cred, true
	c.group = s.groupOf(cred)
	if !s.rate.allow(c.group, s.cfg.Clock.Now()) {
		// Before any identification: a pod that floods pays for its
		// refusals, not for its identifications.
		s.refuseConn(uc, refusedRate, c.group, c.group, cred, codes.ResourceExhausted, rateMessage(s.cfg.MaxConnRatePerCaller, s.cfg.LimitNames.ConnRatePerCaller))
		return nil, info, nil, errRefusedAtHandshake
	}
	if !s.handshakes.acquire(c.group, s.cfg.MaxHandshakes, handshakeShare(s.cfg.MaxHandshakes)) {
		s.refuseConn(uc, refusedHandshakes, c.group, c.group, cred, codes.ResourceExhausted,
			fmt.Sprintf("too many connections being identified at once: at most %d, %d of one pod", s.cfg.MaxHandshakes, handshakeShare(s.cfg.MaxHandshakes)))
		return nil, info, nil, errRefusedAtHandshake
	}
	lc, no := s.admitConn(uc, c)
	s.handshakes.release(c.group)
	if no != nil {
		s.refuseConn(no.nc, no.reason, no.key, c.group, cred, no.code, no.msg)
		return nil, info, nil, errRefusedAtHandshake
	}
	s.log.Info("local client connected", zap.Uint32(logkeys.UID, cred.UID), zap.Uint32(logkeys.GID, cred.GID), zap.Int32(logkeys.PID, cred.PID),
		zap.String(logkeys.Caller, c.key))
	return lc, info, lc, nil
}

// groupOf is what a new connection counts against until its caller is
// known: the pod its process's cgroup names, when the Resolver can tell
// (caller.Grouper); unidentifiedGroup when it cannot (the process has
// exited); else its uid.
func (s *Server) groupOf(cred caller.Cred) string {
	if g, ok := s.cfg.Resolver.(caller.Grouper); ok {
		switch uid, ok := g.Group(cred); {
		case !ok:
			return unidentifiedGroup
		case uid != "":
			return podKey(uid)
		}
	}
	return uidKey(cred)
}

// unidentifiedGroup holds the connections whose pod cannot be told: their
// process has exited (a caller can never be served then), or its cgroup is
// no pod's of a known shape.
const unidentifiedGroup = "unidentified"

// connRefusal is how a connection is refused at its handshake.
type connRefusal struct {
	nc          net.Conn // to answer and close
	reason, key string
	code        codes.Code
	msg         string
}

// admitConn identifies c's caller and counts uc against it, holding a
// handshake slot: the connection to serve, or how to refuse it.
func (s *Server) admitConn(uc *net.UnixConn, c *conn) (*localConn, *connRefusal) {
	cred, key := c.cred, c.group
	if fd, err := peerpidfd.FromConn(uc); err != nil {
		c.pidfdErr = err
		s.log.Debug("local client connected; its process could not be pinned", zap.Int32(logkeys.PID, cred.PID), zap.Error(err))
	} else {
		c.pidfd = fd
	}
	if s.cfg.Resolver != nil {
		// Identified now, so that the connection counts against its pod
		// from the start; the resolver does not wait for a pod it does not
		// know yet: the connection counts against the pod its cgroup names
		// and the first RPC asks again (or CallerArrived does). A final
		// refusal refuses the connection here, with no transport: its
		// caller can never be served (it may have exited).
		ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
		who, err := c.resolve(caller.NoWait(ctx), s.cfg.Resolver)
		cancel()
		switch {
		case err == nil:
			key = callerKey(who, cred)
		case caller.IsTemporary(err):
			if uid := caller.PodOf(err); uid != "" {
				key = podKey(uid)
			}
		default:
			c.closePIDFD()
			if uid := caller.PodOf(err); uid != "" {
				key = podKey(uid)
			}
			return nil, &connRefusal{nc: uc, reason: refusedUnresolved, key: key, code: codes.PermissionDenied,
				msg: fmt.Sprintf("caller not identified: %v", err)}
		}
	} else {
		c.closePIDFD()
	}
	lc := newLocalConn(uc, c, s)
	c.closeConn = func() { _ = lc.Close() } // before join: CallerArrived may close it
	if err := s.callers.join(c, key, s.cfg.MaxConnsPerCaller); err != nil {
		c.closePIDFD()
		return nil, &connRefusal{nc: uc, reason: refusedConnections, key: key, code: codes.ResourceExhausted, msg: status.Convert(err).Message()}
	}
	s.metrics.conns.Inc()
	return lc, nil
}

func (peerCreds) ClientHandshake(_ context.Context, _ string, nc net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nc, authInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}

func (p peerCreds) Clone() credentials.TransportCredentials { return p }

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

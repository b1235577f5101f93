package caclient

import (
	"errors"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/controlplane"
)

// Conn is a CA client's connection to its CA: dialled (Dial) on first use,
// or ahead of it by Preconnect; dropped after a call that failed in the
// transport (Retire), so the next call dials afresh, as pilot-agent rebuilds
// its channel; closed for good by Close. A status the CA answered (a refusal,
// a bad request, even Unavailable sent by the CA itself) leaves the
// connection alone: other identities' calls on it go on. It is safe for concurrent use; nothing waits on the network
// while holding its lock.
type Conn struct {
	transport controlplane.Config
	errClosed error

	mu     sync.Mutex
	conn   *grpc.ClientConn // nil until needed and after a failed call
	closed bool
}

// NewConn returns the connection to transport's CA, not yet dialled. Get
// returns errClosed after Close.
func NewConn(transport controlplane.Config, errClosed error) *Conn {
	// Every connection dialled from here shares what a refused client
	// certificate taught the one before it.
	transport = transport.SharingRefusals()
	return &Conn{transport: transport, errClosed: errClosed}
}

// Get returns the current connection, making one when there is none.
func (c *Conn) Get() (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, c.errClosed
	}
	if c.conn == nil {
		conn, err := controlplane.Dial(c.transport)
		if err != nil {
			return nil, err
		}
		c.conn = conn
	}
	return c.conn, nil
}

// Current returns the connection as it is, nil when none is made: Get
// without dialling.
func (c *Conn) Current() *grpc.ClientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

// Preconnect starts connecting in the background, so the first call finds
// the handshakes done or under way. A failure is left to that call.
func (c *Conn) Preconnect() {
	if conn, err := c.Get(); err == nil {
		conn.Connect()
	}
}

// Retire drops conn after a call on it failed with err, when the failure was
// the transport's and conn is still the current connection, so that the next
// Get dials afresh. A call still running on a retired connection ends with
// Canceled, which is why an answer from the CA never retires it: one
// identity's refusal must not cancel another identity's request.
//
// With a client certificate in the transport, a refusal (Unauthenticated)
// retires the connection too, as pilot-agent rebuilds its channel after a
// failed request: the certificate is chosen at the handshake, and a
// connection made before there was one (a VM's first request, with its
// onboarding token) would go on without it once the token has expired. Such
// an agent asks for one identity, so no other request is cut short.
func (c *Conn) Retire(conn *grpc.ClientConn, err error) {
	refusedWithoutCert := c.transport.ClientCertificate != nil && status.Code(err) == codes.Unauthenticated
	if !refusedWithoutCert && !TransportFailed(conn, err) {
		return
	}
	c.mu.Lock()
	current := c.conn == conn
	if current {
		c.conn = nil
	}
	c.mu.Unlock()
	if current {
		_ = conn.Close()
	}
}

// TransportFailed reports whether a call on conn that ended with err failed
// because the connection did: err is Unavailable or DeadlineExceeded and conn
// is no longer ready, or err is controlplane.ErrUnverifiedPeer (the connection reaches a
// peer that must not be talked to). A status the CA sent arrives on a ready
// connection, whatever its code; a connection that broke is idle, connecting
// or failing by the time the call returns.
func TransportFailed(conn *grpc.ClientConn, err error) bool {
	if errors.Is(err, controlplane.ErrUnverifiedPeer) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
	default:
		return false
	}
	return conn.GetState() != connectivity.Ready
}

// Close closes the connection; Get fails from then on. It is safe to call
// twice.
func (c *Conn) Close() error {
	c.mu.Lock()
	conn := c.conn
	c.conn, c.closed = nil, true
	c.mu.Unlock()
	if conn != nil {
		return conn.Close()
	}
	return nil
}

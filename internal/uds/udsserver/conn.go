package udsserver

import (
	"net"
	"sync"
)

// localConn is a connection to the socket: it gives back its caller's
// counts and its pidfd when closed, and counts what is written.
//
// Wrapping the socket hides it from gRPC, which reads a bare *net.UnixConn
// only when data is there, into a buffer taken from a pool for that read,
// instead of keeping a read buffer per connection while it waits. On Linux
// localConn reads the same way (ReadOnReady), so an idle connection holds
// no read buffer: with one connection per pod in node mode, that is 4 KiB
// per pod.
type localConn struct {
	net.Conn
	c    *conn
	s    *Server
	once sync.Once
	rd   readyRead // used by gRPC's reading goroutine only
	// replay is what park read of the handshake, read again by gRPC
	// before the connection.
	replay []byte
	// frames follows what gRPC writes, for Write to count the responses
	// written (used by gRPC's one writing goroutine at a time).
	frames frameCounter
}

func newLocalConn(uc *net.UnixConn, c *conn, s *Server) *localConn {
	p := &localConn{Conn: uc, c: c, s: s}
	p.rd.init(uc)
	return p
}

// Write writes b and takes the DATA payload it carried off the caller's
// queued bytes: control frames (SETTINGS and PING acknowledgements,
// WINDOW_UPDATE, a response's HEADERS) are not responses drained, so a
// client that never reads but sends SETTINGS frames does not make room
// for more responses.
func (p *localConn) Write(b []byte) (int, error) {
	n, err := p.Conn.Write(b)
	if n > 0 {
		if d := p.frames.data(b[:n]); d > 0 {
			p.c.written(d)
		}
	}
	return n, err
}

// Close gives back what the connection counted against its caller, then
// closes it: a client that sees its connection end finds its count given
// back.
func (p *localConn) Close() error {
	p.once.Do(func() {
		p.c.closePIDFD()
		p.s.callers.leave(p.c)
		p.s.metrics.conns.Dec()
	})
	return p.Conn.Close()
}

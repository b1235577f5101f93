package udsserver

import (
	"io"
	"net"
	"syscall"

	"google.golang.org/grpc/mem"
)

// readyRead reads a socket only once it is readable, into a buffer taken
// from a pool at that moment, so a connection waiting for its next frame
// holds no buffer. Its fields are kept between calls so a read allocates
// nothing; one goroutine reads at a time (gRPC's reader of the connection).
type readyRead struct {
	raw     syscall.RawConn // nil: read through the connection
	do      func(fd uintptr) bool
	size    int
	pool    mem.BufferPool
	buf     *[]byte
	n       int
	readErr error
}

func (r *readyRead) init(uc *net.UnixConn) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return
	}
	r.raw = raw
	r.do = func(fd uintptr) bool {
		buf := r.pool.Get(r.size)
		n, err := syscall.Read(int(fd), *buf)
		if err == syscall.EAGAIN || err == syscall.EWOULDBLOCK {
			r.pool.Put(buf)
			return false // not readable yet: the poller waits and calls again
		}
		if err != nil || n <= 0 {
			r.pool.Put(buf)
			buf, n = nil, 0
		}
		r.buf, r.n, r.readErr = buf, n, err
		return true
	}
}

// ReadOnReady waits until the connection is readable, then reads up to
// size bytes into a buffer of pool, returned with the count; the caller
// puts the buffer back. The end of the connection is io.EOF. gRPC's
// transport uses it in place of a buffered reader of its own when the
// connection has it.
func (p *localConn) ReadOnReady(size int, pool mem.BufferPool) (*[]byte, int, error) {
	if len(p.replay) > 0 {
		buf := pool.Get(size)
		n, _ := p.Read(*buf)
		return buf, n, nil
	}
	r := &p.rd
	if r.raw == nil {
		buf := pool.Get(size)
		n, err := p.Conn.Read(*buf)
		if n == 0 {
			pool.Put(buf)
			return nil, 0, err
		}
		return buf, n, err
	}
	r.size, r.pool = size, pool
	err := r.raw.Read(r.do)
	buf, n, readErr := r.buf, r.n, r.readErr
	r.pool, r.buf, r.n, r.readErr = nil, nil, 0, nil
	switch {
	case err != nil: // the connection is closed
		return nil, 0, err
	case readErr != nil:
		return nil, 0, readErr
	case buf == nil:
		return nil, 0, io.EOF
	}
	return buf, n, nil
}

package udsserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/net/http2"
)

// Parking. gRPC's server transport costs ~14 KB per connection (three
// goroutines and their state) from the moment the HTTP/2 handshake is done,
// and in node mode a pod may hold connections that carry nothing. So the
// server answers the handshake itself and hands the connection to gRPC only
// at its first frame after it: until then the connection is parked, held by
// the one goroutine gRPC runs for a connection in its handshake, waiting on
// the poller with no buffer.
//
// The handshake as parked: the client's preface and SETTINGS are read and
// kept, the server's SETTINGS (the values gRPC sends, see handshakeSettings)
// are written, and the client's acknowledgement of them is read and
// dropped. At hand-off gRPC reads the kept preface and SETTINGS as if they
// had just arrived: it sends its own SETTINGS (the same values; the client
// acknowledges them again, gRPC ignores that) and acknowledges the
// client's. The client's SETTINGS are thus acknowledged only when the
// connection is handed off; gRPC clients do not wait for that.

// maxClientSettings bounds the client's first SETTINGS frame (a setting is 6
// bytes; HTTP/2 defines 6 and a client sends a few).
const maxClientSettings = 64 * 6

// errNotHTTP2 ends a connection that does not start as an HTTP/2 client.
var errNotHTTP2 = errors.New("not an HTTP/2 client preface")

// park takes lc through the HTTP/2 handshake and waits until the client
// sends a frame other than the acknowledgement of the server's SETTINGS,
// or until the idle timeout, the connection's end or the server's stop. On
// nil the connection is ready for gRPC, with what was read kept in
// lc.replay; on an error it is to be closed.
func (s *Server) park(lc *localConn) error {
	if lc.rd.raw == nil {
		return nil // not a socket the poller can wait on: gRPC does it all
	}
	if !s.parked.add(lc) {
		return net.ErrClosed
	}
	defer s.parked.remove(lc)

	// gRPC has set the connection's deadline for its handshake: the
	// preface and SETTINGS are read under it.
	var start [len(http2.ClientPreface) + frameHeaderLen]byte
	if _, err := io.ReadFull(lc.Conn, start[:]); err != nil {
		return err
	}
	if string(start[:len(http2.ClientPreface)]) != http2.ClientPreface {
		return errNotHTTP2
	}
	fh := start[len(http2.ClientPreface):]
	n := int(fh[0])<<16 | int(fh[1])<<8 | int(fh[2])
	if http2.FrameType(fh[3]) != http2.FrameSettings || fh[4]&byte(http2.FlagSettingsAck) != 0 ||
		binary.BigEndian.Uint32(fh[5:])&(1<<31-1) != 0 || n%6 != 0 || n > maxClientSettings {
		return fmt.Errorf("%w: the first frame is not the client's SETTINGS", errNotHTTP2)
	}
	head := make([]byte, len(start)+n) // kept while parked: no more than that
	copy(head, start[:])
	if _, err := io.ReadFull(lc.Conn, head[len(start):]); err != nil {
		return err
	}
	if _, err := lc.Conn.Write(s.settingsFrame); err != nil {
		return err
	}

	if err := lc.Conn.SetDeadline(time.Now().Add(s.cfg.IdleTimeout)); err != nil {
		return err
	}
	for {
		var next [frameHeaderLen]byte
		got, err := lc.peek(next[:])
		if err != nil {
			return err
		}
		if got < frameHeaderLen || next != settingsAck {
			break // a frame for gRPC (or part of one)
		}
		if _, err := io.ReadFull(lc.Conn, next[:]); err != nil {
			return err
		}
	}
	if err := lc.Conn.SetDeadline(time.Time{}); err != nil {
		return err
	}
	lc.replay = head
	return nil
}

// peek waits until the connection is readable and copies what is there, up
// to len(b) bytes, without taking it. The end of the connection is io.EOF.
func (p *localConn) peek(b []byte) (int, error) {
	var (
		n    int
		rerr error
	)
	err := p.rd.raw.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), b, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return rerr != syscall.EAGAIN && rerr != syscall.EWOULDBLOCK
	})
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Read reads what parking kept first, then the connection.
func (p *localConn) Read(b []byte) (int, error) {
	if len(p.replay) > 0 {
		n := copy(b, p.replay)
		p.replay = p.replay[n:]
		if len(p.replay) == 0 {
			p.replay = nil
		}
		return n, nil
	}
	return p.Conn.Read(b)
}

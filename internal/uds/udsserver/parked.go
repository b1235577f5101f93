package udsserver

import (
	"bytes"
	"sync"

	"golang.org/x/net/http2"
)

// handshakeSettings is the server's SETTINGS frame, as gRPC's server
// transport writes it with the server's options: the maximum frame size
// (gRPC's 16 KiB), the streams per connection, a header table of 0.
func (s *Server) handshakeSettings() []byte {
	settings := []http2.Setting{
		{ID: http2.SettingMaxFrameSize, Val: 16 << 10},
		{ID: http2.SettingMaxConcurrentStreams, Val: s.cfg.MaxStreamsPerConn},
		{ID: http2.SettingHeaderTableSize, Val: 0},
	}
	var b bytes.Buffer
	_ = http2.NewFramer(&b, nil).WriteSettings(settings...)
	return b.Bytes()
}

// parkedConns are the connections waiting in park, closed when the server
// stops (gRPC's Stop waits for connections still in their handshake).
type parkedConns struct {
	mu      sync.Mutex
	m       map[*localConn]struct{}
	stopped bool
}

// add records lc; false once the server has stopped.
func (p *parkedConns) add(lc *localConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return false
	}
	if p.m == nil {
		p.m = map[*localConn]struct{}{}
	}
	p.m[lc] = struct{}{}
	return true
}

func (p *parkedConns) remove(lc *localConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, lc)
}

// len is the number of parked connections.
func (p *parkedConns) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}

// stop closes every parked connection and refuses to park more.
func (p *parkedConns) stop() {
	p.mu.Lock()
	conns := make([]*localConn, 0, len(p.m))
	for lc := range p.m {
		conns = append(conns, lc)
	}
	p.stopped = true
	p.mu.Unlock()
	for _, lc := range conns {
		_ = lc.Close()
	}
}

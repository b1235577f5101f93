package udsserver

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// settingsAck is an HTTP/2 SETTINGS frame with the ACK flag.
var settingsAck = [frameHeaderLen]byte{0, 0, 0, byte(http2.FrameSettings), byte(http2.FlagSettingsAck), 0, 0, 0, 0}

const frameHeaderLen = 9

// frameCounter follows a stream of HTTP/2 frames written in pieces and
// counts the DATA payload in each piece.
type frameCounter struct {
	head   [frameHeaderLen]byte
	headN  int // bytes of the current frame's header seen
	left   int // bytes of the current frame's payload not seen yet
	isData bool
}

// data returns how many bytes of b are DATA payload.
func (f *frameCounter) data(b []byte) int64 {
	var n int64
	for len(b) > 0 {
		if f.left == 0 {
			k := copy(f.head[f.headN:], b)
			f.headN += k
			b = b[k:]
			if f.headN < frameHeaderLen {
				return n
			}
			f.headN = 0
			f.left = int(f.head[0])<<16 | int(f.head[1])<<8 | int(f.head[2])
			f.isData = http2.FrameType(f.head[3]) == http2.FrameData
			continue
		}
		k := min(f.left, len(b))
		if f.isData {
			n += int64(k)
		}
		f.left -= k
		b = b[k:]
	}
	return n
}

// handshakeWriteTimeout bounds the write of a refusal (a new connection's
// socket buffer is empty: it never waits in practice).
const handshakeWriteTimeout = 100 * time.Millisecond

// goAway is the server's SETTINGS followed by goAwayFrame.
func (s *Server) goAway(last uint32, debug string) []byte {
	return append(slices.Clip(s.settingsFrame), s.goAwayFrame(last, debug)...)
}

// goAwayFrame is a GOAWAY (last stream last, ENHANCE_YOUR_CALM) carrying
// debug.
func (s *Server) goAwayFrame(last uint32, debug string) []byte {
	const maxDebug = 512
	if len(debug) > maxDebug {
		debug = debug[:maxDebug]
	}
	b := make([]byte, 0, frameHeaderLen+8+len(debug))
	n := 8 + len(debug)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), byte(http2.FrameGoAway), 0, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, last)
	b = binary.BigEndian.AppendUint32(b, uint32(http2.ErrCodeEnhanceYourCalm))
	return append(b, debug...)
}

// tell answers a refused connection: when its client's first call comes
// within refusalWait (clients send their preface, SETTINGS and first call as
// they connect), that call gets the gRPC status code and msg, as one more
// RPC on a connection let in would; then, or at once, a GOAWAY carrying
// msg. At most maxAwaitingPerGroup refused connections of group, and
// maxAwaiting in all, wait at once; beyond, the GOAWAY is written without
// waiting. A client whose connection is closed before it has written its
// preface reports a broken pipe instead.
func (s *Server) tell(nc net.Conn, group string, code codes.Code, msg string) {
	if !s.awaiting.acquire(group, maxAwaiting, maxAwaitingPerGroup) {
		_ = nc.SetDeadline(time.Now().Add(handshakeWriteTimeout))
		_, _ = nc.Write(s.goAway(0, msg))
		return
	}
	defer s.awaiting.release(group)
	_ = nc.SetDeadline(time.Now().Add(time.Duration(s.refusalWait.Load())))
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(nc, preface[:]); err != nil || string(preface[:]) != http2.ClientPreface {
		_, _ = nc.Write(s.goAway(0, msg))
		return
	}
	fr := http2.NewFramer(nc, nc)
	fr.SetMaxReadFrameSize(maxRefusedFrame)
	if f, err := fr.ReadFrame(); err != nil || f.Header().Type != http2.FrameSettings {
		_, _ = nc.Write(s.goAway(0, msg))
		return
	}
	if _, err := nc.Write(append(slices.Clip(s.settingsFrame), settingsAck[:]...)); err != nil {
		return
	}
	const maxFrames = 8 // SETTINGS acknowledgements, WINDOW_UPDATEs before the call
	for range maxFrames {
		f, err := fr.ReadFrame()
		if err != nil {
			break
		}
		if h, ok := f.(*http2.HeadersFrame); ok {
			_, _ = nc.Write(append(trailersOnly(h.StreamID, code, msg), s.goAwayFrame(h.StreamID, msg)...))
			return
		}
	}
	_, _ = nc.Write(s.goAwayFrame(0, msg))
}

// trailersOnly is a gRPC response of stream id that is only its status.
func trailersOnly(id uint32, code codes.Code, msg string) []byte {
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	enc.SetMaxDynamicTableSizeLimit(0) // the client was told a header table of 0
	for _, f := range [][2]string{{":status", "200"}, {"content-type", "application/grpc"},
		{"grpc-status", strconv.Itoa(int(code))}, {"grpc-message", grpcMessage(msg)}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	var out bytes.Buffer
	_ = http2.NewFramer(&out, nil).WriteHeaders(http2.HeadersFrameParam{
		StreamID: id, BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true})
	return out.Bytes()
}

// grpcMessage percent-encodes msg as the grpc-message header wants it.
func grpcMessage(msg string) string {
	var b strings.Builder
	for i := range len(msg) {
		c := msg[i]
		if c >= ' ' && c <= '~' && c != '%' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// refusalWait bounds tell's wait; maxAwaiting bounds the refused
// connections waiting in it at once, maxAwaitingPerGroup those of one group;
// maxRefusedFrame bounds a frame tell reads (the client's first HEADERS;
// the server's SETTINGS allow 16 KiB).
const (
	refusalWait         = 250 * time.Millisecond
	maxAwaiting         = 64
	maxAwaitingPerGroup = 4
	maxRefusedFrame     = 16 << 10
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

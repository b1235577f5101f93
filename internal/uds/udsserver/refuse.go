package udsserver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

// Refusing at the handshake. A connection refused when it is accepted (over
// its group's share of the handshakes in flight or over them all, over its
// caller's connections or connection rate, or a caller refused for good)
// never gets a gRPC transport: the server answers on the socket itself
// (tell) and closes it: the client's first call, when it comes at once, gets
// the status (ResourceExhausted naming the setting, or PermissionDenied
// with the reason), then a GOAWAY carries the same text (ENHANCE_YOUR_CALM).
// What it costs is the accept, the identification and a few small reads and
// writes within refusalWait, waited for by at most maxAwaitingPerGroup
// refused connections of one group and maxAwaiting in all (beyond, the
// GOAWAY is written at once); nothing stays.
//
// A group is what a connection counts against before its caller is known
// (groupOf): the pod its process's cgroup names, unidentified when that
// cannot be told (the process has exited), else its uid. A pod whose
// processes take a fresh uid for each connection is one group.

// errRefusedAtHandshake ends a connection refused at its handshake: gRPC
// closes it without logging (it is closed already).
var errRefusedAtHandshake = errors.New("connection refused at its handshake")

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

// refuseConn refuses nc at its handshake: GOAWAY saying msg, then closed;
// counted under reason and logged at a bounded rate under key, before the
// client can hear of it (a client told, then reading the metric, sees it).
// Its wait for the client's call counts against group.
func (s *Server) refuseConn(nc net.Conn, reason, key, group string, cred caller.Cred, code codes.Code, msg string) {
	s.metrics.refused.WithLabelValues(reason).Inc()
	s.refusals.log(key, reason, cred, msg)
	s.tell(nc, group, code, msg)
	_ = nc.Close()
}

// slots bound what connections hold at one step of their handshake (being
// identified, Config.MaxHandshakes; refused and waiting for their client's
// call, maxAwaiting), in all and per group, so that one pod cannot take
// them all.
type slots struct {
	mu    sync.Mutex
	total int
	per   map[string]int
}

// acquire takes a slot of group, or reports false when the group holds
// share of them or all hold max.
func (s *slots) acquire(group string, max, share int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total >= max || s.per[group] >= share {
		return false
	}
	if s.per == nil {
		s.per = map[string]int{}
	}
	s.total++
	s.per[group]++
	return true
}

func (s *slots) release(group string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.per[group]--; s.per[group] <= 0 {
		delete(s.per, group)
	}
}

// count is the slots group holds.
func (s *slots) count(group string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.per[group]
}

// handshakeShares: one group holds at most 1/handshakeShares of
// Config.MaxHandshakes (at least one): an identification takes tens of
// microseconds, so that many pods flooding at once are needed to keep
// another pod's connection waiting, not one.
const handshakeShares = 8

func handshakeShare(total int) int { return max(1, total/handshakeShares) }

// connRate is a token bucket (x/time/rate) per caller key: a caller may
// open burst connections at once, then perSec a second. Buckets are swept
// past rateSweepAt callers, so a Limiter (96 bytes) per key stays bounded.
type connRate struct {
	perSec rate.Limit
	burst  int
	mu     sync.Mutex
	m      map[string]*rate.Limiter
}

func newConnRate(perSec, burst int) *connRate {
	return &connRate{perSec: rate.Limit(perSec), burst: burst, m: map[string]*rate.Limiter{}}
}

// rateSweepAt is the number of buckets above which full ones are dropped
// (a full bucket is what a new one would be).
const rateSweepAt = 1024

// allow takes a token of key's bucket, or reports false when it is empty.
func (r *connRate) allow(key string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.m[key]
	if l == nil {
		if len(r.m) >= rateSweepAt {
			r.sweep(now)
		}
		l = rate.NewLimiter(r.perSec, r.burst)
		r.m[key] = l
	}
	return l.AllowN(now, 1)
}

func (r *connRate) sweep(now time.Time) {
	for k, l := range r.m {
		if l.TokensAt(now) >= float64(r.burst) {
			delete(r.m, k)
		}
	}
}

// refusalLogInterval is how often a caller's refusals are logged: its
// first at once, then one line per interval with how many followed.
const refusalLogInterval = 10 * time.Second

// maxRefusalLogKeys bounds the callers whose refusals are tracked for the
// log at once; refusals of more are logged together under
// refusalLogOthers.
const maxRefusalLogKeys = 256

const refusalLogOthers = "others"

// refusals is the rate-bounded log of refusals, per group or caller: a pod
// is one key whatever uids its processes take, so that it cannot push
// another pod's refusals out of the log.
type refusals struct {
	logger   *zap.Logger
	interval time.Duration

	mu      sync.Mutex
	pending map[string]*refusalCount // refusals not logged yet, per key
}

type refusalCount struct {
	n       int
	reasons map[string]int
}

func newRefusals(log *zap.Logger) *refusals {
	return &refusals{logger: log, interval: refusalLogInterval, pending: map[string]*refusalCount{}}
}

// log logs a refusal of caller key: the first of an interval at once, the
// others counted and logged in one line at the interval's end.
func (r *refusals) log(key, reason string, cred caller.Cred, msg string) {
	r.mu.Lock()
	if _, ok := r.pending[key]; !ok && len(r.pending) >= maxRefusalLogKeys {
		key = refusalLogOthers
	}
	if p, ok := r.pending[key]; ok {
		p.n++
		p.reasons[reason]++
		r.mu.Unlock()
		return
	}
	r.pending[key] = &refusalCount{reasons: map[string]int{}}
	interval := r.interval
	r.mu.Unlock()
	r.logger.Warn("local client refused", zap.String(logkeys.Caller, key), zap.String(logkeys.Reason, reason), zap.Stringer(logkeys.Cred, cred),
		zap.String(logkeys.Error, msg))
	time.AfterFunc(interval, func() { r.flush(key, interval) })
}

// flush logs how many refusals of key followed its logged one.
func (r *refusals) flush(key string, interval time.Duration) {
	r.mu.Lock()
	p := r.pending[key]
	delete(r.pending, key)
	r.mu.Unlock()
	if p == nil || p.n == 0 {
		return
	}
	reasons := make([]string, 0, len(p.reasons))
	for reason, n := range p.reasons {
		reasons = append(reasons, reason+"="+strconv.Itoa(n))
	}
	sort.Strings(reasons)
	r.logger.Warn("local client refused again", zap.String(logkeys.Caller, key), zap.Int(logkeys.Refused, p.n),
		zap.String(logkeys.Reasons, strings.Join(reasons, ",")), zap.Duration(logkeys.Within, interval))
}

// rateMessage is the refusal of a connection over its caller's rate.
func rateMessage(perSec int) string {
	return fmt.Sprintf("too many new connections from this caller: at most %d a second (%s)", perSec, SettingMaxConnRatePerCaller)
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

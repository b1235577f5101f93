package udsserver

import (
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/internal/uds/caller"
)

// Settings named by the limits' refusals, so a refused caller (and whoever
// reads its logs) knows which one to raise.
const (
	SettingMaxConnsPerCaller    = "MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER"
	SettingMaxStreamsPerConn    = "MESHAGENT_SOCKET_MAX_STREAMS_PER_CONNECTION"
	SettingMaxUnaryPerCaller    = "MESHAGENT_SOCKET_MAX_UNARY_PER_CALLER"
	SettingMaxQueuedPerCaller   = "MESHAGENT_SOCKET_MAX_QUEUED_BYTES_PER_CALLER"
	SettingIdleTimeout          = "MESHAGENT_SOCKET_IDLE_TIMEOUT"
	SettingMaxConnRatePerCaller = "MESHAGENT_SOCKET_MAX_CONNECTION_RATE_PER_CALLER"
)

// callerKey names who a connection counts against: its pod, or the uid of
// a process outside any pod (node processes, a sidecar's callers). A
// connection whose pod is not known yet counts against the pod its cgroup
// names (caller.PodOf), so that it shares no bucket with other pods.
func callerKey(info caller.Info, cred caller.Cred) string {
	if info.PodUID != "" {
		return podKey(info.PodUID)
	}
	return uidKey(cred)
}

func uidKey(cred caller.Cred) string { return "uid:" + strconv.FormatUint(uint64(cred.UID), 10) }

// connKey is the caller key c counts against, for the logs: its group's
// when it counts against none.
func connKey(c *conn) string {
	if st := c.state.Load(); st != nil {
		return st.key
	}
	if c.group != "" {
		return c.group
	}
	return uidKey(c.cred)
}

func podKey(uid string) string { return "pod:" + uid }

// callerState is what one caller holds across its connections.
type callerState struct {
	key    string                  // the caller's key, as in callers.m
	conns  map[*conn]struct{}      // guarded by callers.mu
	unary  atomic.Int64            // unary calls being served
	queued atomic.Int64            // response bytes handed to gRPC, not yet written
	gone   atomic.Pointer[gonePod] // set when the pod left: its connections are refused
}

// gonePod is why a caller's connections are refused from now on.
type gonePod struct{ err error }

// callers counts connections, unary calls and queued bytes per caller.
type callers struct {
	mu sync.Mutex
	m  map[string]*callerState
}

// join counts c against key, or returns a ResourceExhausted status when key
// holds max connections already.
func (cs *callers) join(c *conn, key string, max int) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st := cs.m[key]
	if st == nil {
		st = &callerState{key: key, conns: map[*conn]struct{}{}}
		cs.m[key] = st
	}
	if len(st.conns) >= max {
		return status.Errorf(codes.ResourceExhausted,
			"too many connections from this caller: at most %d are open at once (%s)", max, SettingMaxConnsPerCaller)
	}
	st.conns[c] = struct{}{}
	c.key = key
	c.state.Store(st)
	return nil
}

// leave stops counting c, giving back what it has queued.
func (cs *callers) leave(c *conn) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st := c.state.Load()
	if st == nil {
		return
	}
	delete(st.conns, c)
	st.queued.Add(-c.queued.Swap(0))
	if len(st.conns) == 0 && cs.m[c.key] == st {
		delete(cs.m, c.key)
	}
	c.key = ""
	c.state.Store(nil)
}

// move counts c against key instead of its current caller (a connection
// identified after it was accepted).
func (cs *callers) move(c *conn, key string, max int) error {
	cs.mu.Lock()
	oldKey := c.key
	cs.mu.Unlock()
	if oldKey == key {
		return nil
	}
	cs.leave(c)
	if err := cs.join(c, key, max); err != nil {
		// Back where it was, over any limit: it was counted there already.
		cs.mu.Lock()
		st := cs.m[oldKey]
		if st == nil {
			st = &callerState{key: oldKey, conns: map[*conn]struct{}{}}
			cs.m[oldKey] = st
		}
		st.conns[c] = struct{}{}
		c.key = oldKey
		c.state.Store(st)
		cs.mu.Unlock()
		return err
	}
	return nil
}

// connsOf returns the connections counted against key.
func (cs *callers) connsOf(key string) []*conn {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st := cs.m[key]
	if st == nil {
		return nil
	}
	out := make([]*conn, 0, len(st.conns))
	for c := range st.conns {
		out = append(out, c)
	}
	return out
}

// leaveAll marks key gone with err and returns its connections.
func (cs *callers) leaveAll(key string, err error) []*conn {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st := cs.m[key]
	if st == nil {
		return nil
	}
	st.gone.Store(&gonePod{err: err})
	delete(cs.m, key) // a new connection of the key starts afresh
	out := make([]*conn, 0, len(st.conns))
	for c := range st.conns {
		out = append(out, c)
	}
	return out
}

// grpcMessagePrefix is gRPC's header of each message in DATA frames
// (compression flag, length).
const grpcMessagePrefix = 5

// wireSize is the size of a message gRPC is about to send, as DATA
// payload.
func wireSize(m any) int64 {
	switch v := m.(type) {
	case WireMessage:
		return grpcMessagePrefix + int64(v.WireBuffers().Len())
	case proto.Message:
		return grpcMessagePrefix + int64(proto.Size(v))
	}
	return 0
}

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

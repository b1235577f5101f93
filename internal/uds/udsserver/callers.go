package udsserver

import (
	"strconv"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/internal/uds/caller"
)

// Settings named by the limits' refusals, so a refused caller (and whoever
// reads its logs) knows which one to raise.
const (
	SettingMaxConnsPerCaller  = "MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER"
	SettingMaxStreamsPerConn  = "MESHAGENT_SOCKET_MAX_STREAMS_PER_CONNECTION"
	SettingMaxUnaryPerCaller  = "MESHAGENT_SOCKET_MAX_UNARY_PER_CALLER"
	SettingMaxQueuedPerCaller = "MESHAGENT_SOCKET_MAX_QUEUED_BYTES_PER_CALLER"
	SettingIdleTimeout        = "MESHAGENT_SOCKET_IDLE_TIMEOUT"
)

// callerKey names who a connection counts against: its pod, or the uid of
// a process outside any pod (node processes, a sidecar's callers, and
// connections whose caller is not identified yet).
func callerKey(info caller.Info, cred caller.Cred) string {
	if info.PodUID != "" {
		return podKey(info.PodUID)
	}
	return "uid:" + strconv.FormatUint(uint64(cred.UID), 10)
}

func podKey(uid string) string { return "pod:" + uid }

// callerState is what one caller holds across its connections.
type callerState struct {
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
		st = &callerState{conns: map[*conn]struct{}{}}
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
			st = &callerState{conns: map[*conn]struct{}{}}
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

// wireSize is the size of a message gRPC is about to send.
func wireSize(m any) int64 {
	switch v := m.(type) {
	case WireMessage:
		return int64(v.WireBuffers().Len())
	case proto.Message:
		return int64(proto.Size(v))
	}
	return 0
}

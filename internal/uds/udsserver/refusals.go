package udsserver

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
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
func rateMessage(perSec int, name string) string {
	return fmt.Sprintf("too many new connections from this caller: at most %d a second%s", perSec, named(name))
}

package brokerapi

import (
	"context"
	"sync"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"go.uber.org/zap"
	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/logkeys"
)

// The reasons of google.rpc.ErrorInfo for reference errors, as the SPIFFE
// Broker API standard names them, and their domain.
const (
	reasonRefInvalid   = "WORKLOAD_REFERENCE_INVALID"
	reasonNotFound     = "WORKLOAD_NOT_FOUND"
	reasonNotEntitled  = "WORKLOAD_NOT_ENTITLED"
	errorInfoDomain    = "spiffe.io"
	metadataRefTypeKey = "reference_type"
)

// refusal is a refused call: its metric reason, gRPC code, ErrorInfo reason
// (empty: none) and message for the broker.
type refusal struct {
	reason string
	code   codes.Code
	info   string
	msg    string
}

func (r *refusal) Error() string { return r.msg }

// status is the refusal as the broker sees it.
func (r *refusal) status(refType string) error {
	st := status.New(r.code, r.msg)
	if r.info == "" {
		return st.Err()
	}
	md := map[string]string{}
	if refType != "" {
		md[metadataRefTypeKey] = refType
	}
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: r.info, Domain: errorInfoDomain, Metadata: md}); err == nil {
		st = d
	}
	return st.Err()
}

func invalidRef(msg string) *refusal {
	return &refusal{reason: refusedRefInvalid, code: codes.InvalidArgument, info: reasonRefInvalid, msg: msg}
}

func notFound(msg string) *refusal {
	return &refusal{reason: refusedNotFound, code: codes.NotFound, info: reasonNotFound, msg: msg}
}

func notEntitled(msg string) *refusal {
	return &refusal{reason: refusedNotEntitled, code: codes.PermissionDenied, info: reasonNotEntitled, msg: msg}
}

// refuse counts and logs (at a bounded rate) a refusal, and returns the
// status the broker gets.
func (s *Server) refuse(ctx context.Context, method string, broker spiffeid.ID, refType string, r *refusal) error {
	s.metrics.refused.WithLabelValues(r.reason).Inc()
	s.refusals.note(method, broker, r)
	return r.status(refType)
}

// authorize checks the security header and that the peer is an allowed
// broker. It is the first thing every method does, and costs a map look-up.
func (s *Server) authorize(ctx context.Context, method string) (Broker, error) {
	s.metrics.calls.WithLabelValues(method).Inc()
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(headerKey); len(v) != 1 || v[0] != headerValue {
		return Broker{}, s.refuse(ctx, method, peerID(ctx), "", &refusal{reason: refusedHeader, code: codes.InvalidArgument,
			msg: "security header missing from request: the SPIFFE Broker API needs the gRPC metadata broker.spiffe.io: true"})
	}
	id := peerID(ctx)
	b, ok := s.allowed[id]
	if !ok || id.IsZero() {
		return Broker{}, s.refuse(ctx, method, id, "", &refusal{reason: refusedNotBroker, code: codes.PermissionDenied,
			msg: "not an allowed broker: " + describeID(id) + " is not listed in this agent's brokers"})
	}
	return b, nil
}

func describeID(id spiffeid.ID) string {
	if id.IsZero() {
		return "a client without a SPIFFE ID"
	}
	return id.String()
}

// peerID is the SPIFFE ID of the verified client certificate; zero when
// there is none.
func peerID(ctx context.Context) spiffeid.ID {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return spiffeid.ID{}
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return spiffeid.ID{}
	}
	id, err := x509svid.IDFromCert(info.State.PeerCertificates[0])
	if err != nil {
		return spiffeid.ID{}
	}
	return id
}

// Refusal log: a burst of lines, then one a second, each saying how many
// were left out since the last.
const (
	refusalLogBurst = 10
	refusalLogEvery = 1 // per second
)

type refusalLog struct {
	log   *zap.Logger
	clock clock.PassiveClock

	mu         sync.Mutex
	limit      *rate.Limiter
	suppressed int
}

func newRefusalLog(log *zap.Logger, clk clock.PassiveClock) *refusalLog {
	return &refusalLog{log: log, clock: clk, limit: rate.NewLimiter(refusalLogEvery, refusalLogBurst)}
}

func (l *refusalLog) note(method string, broker spiffeid.ID, r *refusal) {
	l.mu.Lock()
	if !l.limit.AllowN(l.clock.Now(), 1) {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	l.log.Warn("broker API call refused", zap.String(logkeys.Method, method), zap.String(logkeys.Broker, describeID(broker)),
		zap.String(logkeys.Reason, r.reason), zap.String(logkeys.Code, r.code.String()), zap.String(logkeys.Message, r.msg),
		zap.Int(logkeys.Suppressed, suppressed))
}

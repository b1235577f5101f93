package sds

import (
	"context"
	"errors"
	"io"
	"reflect"
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/secretmanager"
)

// action is what a request asks of the stream.
type action int

const (
	// actRespond: the subscription is new or its names changed; reply.
	actRespond action = iota
	// actACK: the client accepted our latest response; no reply.
	actACK
	// actNACK: the client rejected our latest response; no reply.
	actNACK
	// actStale: the request answers an older response; ignore it.
	actStale
	// actBadType: the request is for another resource type; end the stream.
	actBadType
)

// streamState is the xDS bookkeeping of one stream. It is used only by the
// stream's own goroutine.
type streamState struct {
	subscribed bool
	requested  []string // the names of the last accepted request, sorted and unique
	names      []string // the names served: requested, or the defaults
	nonce      string   // nonce of our latest response
	sent       []uint64 // versions of names in our latest response
	watches    map[string]watch
}

type watch struct {
	ch     <-chan struct{}
	cancel func()
}

// classify applies the xDS stream rules of SPEC 9 to req.
func (st *streamState) classify(req *discoveryv3.DiscoveryRequest) action {
	if checkType(req.GetTypeUrl()) != nil {
		return actBadType
	}
	if st.subscribed && req.GetResponseNonce() != "" && req.GetResponseNonce() != st.nonce {
		return actStale
	}
	if req.GetErrorDetail() != nil {
		return actNACK
	}
	if !st.subscribed || !slices.Equal(sortedUnique(req.GetResourceNames()), st.requested) {
		return actRespond
	}
	return actACK
}

func sortedUnique(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
}

// subscribe makes the stream follow names: it watches new names before their
// secrets are read (so no change slips between read and watch) and stops
// watching names it no longer serves.
func (st *streamState) subscribe(src SecretSource, requested, names []string) {
	if st.watches == nil {
		st.watches = make(map[string]watch)
	}
	keep := make(map[string]bool, len(names))
	for _, n := range names {
		keep[n] = true
		if _, ok := st.watches[n]; !ok {
			ch, cancel := src.Watch(n)
			st.watches[n] = watch{ch: ch, cancel: cancel}
		}
	}
	for n, w := range st.watches {
		if !keep[n] {
			w.cancel()
			delete(st.watches, n)
		}
	}
	st.subscribed = true
	st.requested = sortedUnique(requested)
	st.names = names
}

func (st *streamState) unwatchAll() {
	for n, w := range st.watches {
		w.cancel()
		delete(st.watches, n)
	}
}

// changed reports whether secrets differ from what the stream last sent.
func (st *streamState) changed(secrets []*secretmanager.Secret) bool {
	if len(secrets) != len(st.sent) {
		return true
	}
	for i, s := range secrets {
		if s.Version != st.sent[i] {
			return true
		}
	}
	return false
}

// streamLog logs with the stream's id. It adds the id to each entry rather
// than cloning the logger (zap's With copies an encoder per stream).
type streamLog struct {
	base *zap.Logger
	id   uint64
}

func (l streamLog) Debug(msg string, fields ...zap.Field) { l.write(zap.DebugLevel, msg, fields) }
func (l streamLog) Warn(msg string, fields ...zap.Field)  { l.write(zap.WarnLevel, msg, fields) }

func (l streamLog) write(lvl zapcore.Level, msg string, fields []zap.Field) {
	if ce := l.base.Check(lvl, msg); ce != nil {
		ce.Write(append(fields, zap.Uint64(keyStream, l.id))...)
	}
}

// StreamSecrets serves one SDS stream. One goroutine reads requests; this
// one decides, reads secrets and sends, so a slow client only slows itself.
func (s *Server) StreamSecrets(stream secretv3.SecretDiscoveryService_StreamSecretsServer) error {
	ctx := stream.Context()
	if n := s.open.Add(1); n > int64(s.cfg.MaxStreams) {
		s.open.Add(-1)
		s.metrics.refused.WithLabelValues(refusedStreams).Inc()
		s.log.Warn("SDS stream refused: too many streams", zap.Int(keyMaxStreams, s.cfg.MaxStreams))
		return status.Errorf(codes.ResourceExhausted, "too many SDS streams: at most %d (MaxStreams) are served at once", s.cfg.MaxStreams)
	}
	defer s.open.Add(-1)
	log := streamLog{base: s.log, id: s.streamIDs.Add(1)}
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()

	reqs := make(chan *discoveryv3.DiscoveryRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()

	st := &streamState{}
	defer st.unwatchAll()
	err := s.serveStream(ctx, stream, st, reqs, recvErr, log)
	if err != nil {
		s.countError(err)
		if c := status.Code(err); c != codes.Canceled {
			log.Warn("SDS stream ended with an error", zap.String(keyCode, c.String()), zap.Error(err))
		}
	}
	return err
}

// Fixed positions of the select cases of a stream with more than two
// watched names; watch channels follow.
const (
	caseDone = iota
	caseRequest
	caseRecvErr
	caseWatches
)

func (s *Server) serveStream(ctx context.Context, stream secretv3.SecretDiscoveryService_StreamSecretsServer, st *streamState,
	reqs <-chan *discoveryv3.DiscoveryRequest, recvErr <-chan error, log streamLog) error {
	// Streams watch one or two names almost always ("default", "ROOTCA"): a
	// plain select on w0 and w1 (nil when unused) serves them without
	// reflection; more names use reflect.Select over cases.
	var (
		w0, w1 <-chan struct{}
		cases  []reflect.SelectCase
	)
	for {
		var (
			req    *discoveryv3.DiscoveryRequest
			change bool
		)
		if cases == nil {
			select {
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			case err := <-recvErr:
				return endOfRecv(err)
			case req = <-reqs:
			case <-w0:
				change = true
			case <-w1:
				change = true
			}
		} else {
			chosen, v, _ := reflect.Select(cases)
			switch chosen {
			case caseDone:
				return status.FromContextError(ctx.Err()).Err()
			case caseRecvErr:
				err, _ := v.Interface().(error)
				return endOfRecv(err)
			case caseRequest:
				req, _ = v.Interface().(*discoveryv3.DiscoveryRequest)
			default:
				change = true
			}
		}
		if change {
			if err := s.push(ctx, stream, st, log); err != nil {
				return err
			}
			continue
		}
		resubscribed, err := s.handleRequest(ctx, stream, st, req, log)
		if err != nil {
			return err
		}
		if !resubscribed {
			continue
		}
		w0, w1, cases = nil, nil, nil
		switch n := len(st.names); {
		case n > 2:
			cases = []reflect.SelectCase{
				caseDone:    {Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
				caseRequest: {Dir: reflect.SelectRecv, Chan: reflect.ValueOf(reqs)},
				caseRecvErr: {Dir: reflect.SelectRecv, Chan: reflect.ValueOf(recvErr)},
			}
			for _, name := range st.names {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(st.watches[name].ch)})
			}
		case n == 2:
			w0, w1 = st.watches[st.names[0]].ch, st.watches[st.names[1]].ch
		case n == 1:
			w0 = st.watches[st.names[0]].ch
		}
	}
}

// endOfRecv turns the receive loop's error into the stream's result: the
// client closing its side ends the stream cleanly.
func endOfRecv(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// handleRequest acts on one request and reports whether the subscription
// changed.
func (s *Server) handleRequest(ctx context.Context, stream secretv3.SecretDiscoveryService_StreamSecretsServer, st *streamState,
	req *discoveryv3.DiscoveryRequest, log streamLog) (bool, error) {
	switch st.classify(req) {
	case actBadType:
		return false, checkType(req.GetTypeUrl())
	case actStale:
		s.metrics.stale.Inc()
		log.Debug("stale SDS request ignored", zap.String(keyNonce, req.GetResponseNonce()))
		return false, nil
	case actNACK:
		s.metrics.nacks.Inc()
		log.Warn("client rejected secrets",
			zap.Strings(keyNames, req.GetResourceNames()),
			zap.String(keyNonce, req.GetResponseNonce()),
			zap.String(keyErrorDetail, req.GetErrorDetail().GetMessage()))
		return false, nil
	case actACK:
		s.metrics.acks.Inc()
		log.Debug("secrets acknowledged", zap.String(keyVersion, req.GetVersionInfo()), zap.String(keyNonce, req.GetResponseNonce()))
		return false, nil
	}
	names, err := s.names(req.GetResourceNames())
	if err != nil {
		return false, err
	}
	st.subscribe(s.cfg.Secrets, req.GetResourceNames(), names)
	secrets, err := s.resolve(ctx, names)
	if err != nil {
		return true, err
	}
	return true, s.send(stream, st, secrets, pushRequest, log)
}

// push sends the subscribed secrets again if any of them changed.
func (s *Server) push(ctx context.Context, stream secretv3.SecretDiscoveryService_StreamSecretsServer, st *streamState, log streamLog) error {
	secrets, err := s.resolve(ctx, st.names)
	if err != nil {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		// Keep the stream and what the client holds; the next change retries.
		log.Warn("secret update not pushed", zap.Strings(keyNames, st.names), zap.Error(err))
		return nil
	}
	if !st.changed(secrets) {
		return nil
	}
	return s.send(stream, st, secrets, pushUpdate, log)
}

func (s *Server) send(stream secretv3.SecretDiscoveryService_StreamSecretsServer, st *streamState,
	secrets []*secretmanager.Secret, reason string, log streamLog) error {
	resp, err := s.response(st.names, secrets)
	if err != nil {
		return err
	}
	if err := stream.Send(resp); err != nil {
		return err
	}
	st.nonce = resp.GetNonce()
	st.sent = st.sent[:0]
	for _, sec := range secrets {
		st.sent = append(st.sent, sec.Version)
	}
	s.metrics.pushes.WithLabelValues(reason).Inc()
	log.Debug("secrets sent", zap.Strings(keyNames, st.names), zap.String(keyVersion, resp.GetVersionInfo()),
		zap.String(keyNonce, resp.GetNonce()), zap.String(keyReason, reason))
	return nil
}

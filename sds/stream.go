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
	requested  []string          // the names of the last accepted request, sorted and unique
	names      []string          // the names served: requested, or the defaults
	nonce      string            // nonce of our latest response
	sent       map[string]uint64 // version of each name last sent on the stream
	missing    map[string]bool   // names not available at the last look
	watches    map[string]watch
	// peek is the stream's context, already cancelled: a source asked with
	// it answers at once with what it holds, so no name waits for another.
	peek context.Context
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
	if !st.subscribed || !slices.Equal(sortedUnique(req.GetResourceNames()), st.requested) {
		// A NACK that also changes the names is a subscription change too:
		// the client wants other names, whatever it thought of the last
		// response.
		return actRespond
	}
	if req.GetErrorDetail() != nil {
		return actNACK
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
func (st *streamState) subscribe(ctx context.Context, src SecretSource, requested, names []string) {
	if st.watches == nil {
		st.watches = make(map[string]watch)
	}
	keep := make(map[string]bool, len(names))
	for _, n := range names {
		keep[n] = true
		if _, ok := st.watches[n]; !ok {
			ch, cancel := src.Watch(ctx, n)
			st.watches[n] = watch{ch: ch, cancel: cancel}
		}
	}
	for n, w := range st.watches {
		if !keep[n] {
			w.cancel()
			delete(st.watches, n)
			delete(st.sent, n)
			delete(st.missing, n)
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

// changed reports whether an available secret differs from what the stream
// last sent under its name. secrets[i] is nil for a name not available now.
func (st *streamState) changed(names []string, secrets []*secretmanager.Secret) bool {
	for i, s := range secrets {
		if s == nil {
			continue
		}
		if v, ok := st.sent[names[i]]; !ok || v != s.Version {
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
func (l streamLog) Info(msg string, fields ...zap.Field)  { l.write(zap.InfoLevel, msg, fields) }
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

	peek, cancelPeek := context.WithCancel(ctx)
	cancelPeek()
	st := &streamState{peek: peek}
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
	act := st.classify(req)
	if req.GetErrorDetail() != nil && (act == actNACK || act == actRespond) {
		s.metrics.nacks.Inc()
		log.Warn("client rejected secrets",
			zap.Strings(keyNames, req.GetResourceNames()),
			zap.String(keyNonce, req.GetResponseNonce()),
			zap.String(keyErrorDetail, req.GetErrorDetail().GetMessage()))
	}
	switch act {
	case actBadType:
		return false, checkType(req.GetTypeUrl())
	case actStale:
		s.metrics.stale.Inc()
		log.Debug("stale SDS request ignored", zap.String(keyNonce, req.GetResponseNonce()))
		return false, nil
	case actNACK:
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
	st.subscribe(ctx, s.cfg.Secrets, req.GetResourceNames(), names)
	secrets, err := s.available(st, names, log)
	if err != nil {
		return true, err
	}
	return true, s.send(stream, st, secrets, pushRequest, log)
}

// push sends the subscribed secrets again if any of them changed.
func (s *Server) push(ctx context.Context, stream secretv3.SecretDiscoveryService_StreamSecretsServer, st *streamState, log streamLog) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	secrets, err := s.available(st, st.names, log)
	if err != nil {
		return err
	}
	if !st.changed(st.names, secrets) {
		return nil
	}
	return s.send(stream, st, secrets, pushUpdate, log)
}

// available reads every name of the stream on its own, without waiting:
// secrets[i] is nil for a name that is not available now (no certificate
// yet, CA down, expired, a file not readable yet). Such a name is left out
// of the responses, logged and counted when it becomes unavailable, and
// pushed as soon as its source signals it; the other names are served
// meanwhile. A name that can never be served (unknown, or no identity for
// the caller) fails the stream with InvalidArgument naming it.
func (s *Server) available(st *streamState, names []string, log streamLog) ([]*secretmanager.Secret, error) {
	out := make([]*secretmanager.Secret, len(names))
	for i, name := range names {
		sec, err := s.cfg.Secrets.Secret(st.peek, name)
		if err == nil {
			out[i] = sec
			delete(st.missing, name)
			continue
		}
		if permanent(err) {
			return nil, status.Errorf(codes.InvalidArgument, "resource %.200q cannot be served: %v", name, err)
		}
		if !st.missing[name] {
			if st.missing == nil {
				st.missing = make(map[string]bool)
			}
			st.missing[name] = true
			s.metrics.unavailable.Inc()
			log.Info("resource not available yet; the others are served and it is pushed once it is",
				zap.String(keyName, name), zap.Error(err))
		}
	}
	return out, nil
}

// permanent reports whether a source's error means the name can never be
// served to this caller, as opposed to not yet.
func permanent(err error) bool {
	return errors.Is(err, secretmanager.ErrUnknownResource) || errors.Is(err, secretmanager.ErrNoIdentity)
}

// send sends the available secrets (nil entries are left out); with none
// available it sends nothing.
func (s *Server) send(stream secretv3.SecretDiscoveryService_StreamSecretsServer, st *streamState,
	secrets []*secretmanager.Secret, reason string, log streamLog) error {
	var (
		names []string
		have  []*secretmanager.Secret
	)
	for i, sec := range secrets {
		if sec != nil {
			names, have = append(names, st.names[i]), append(have, sec)
		}
	}
	if len(have) == 0 {
		return nil
	}
	resp, err := s.response(names, have)
	if err != nil {
		return err
	}
	if err := stream.Send(resp); err != nil {
		return err
	}
	st.nonce = resp.GetNonce()
	if st.sent == nil {
		st.sent = make(map[string]uint64, len(names))
	}
	for i, sec := range have {
		st.sent[names[i]] = sec.Version
	}
	s.metrics.pushes.WithLabelValues(reason).Inc()
	log.Debug("secrets sent", zap.Strings(keyNames, names), zap.String(keyVersion, resp.GetVersionInfo()),
		zap.String(keyNonce, resp.GetNonce()), zap.String(keyReason, reason))
	return nil
}

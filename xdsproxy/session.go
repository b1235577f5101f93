package xdsproxy

import (
	"context"
	"errors"
	"io"
	"sync"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/backoff"
	"github.com/meshagent/meshagent/internal/logkeys"
)

// session is one downstream stream and the upstream streams opened for it,
// one at a time.
//
// Two goroutines work on it: the downstream reader (requests: inspect, then
// queue for the current upstream stream) and the upstream loop (open a
// stream, restore subscriptions, forward responses downstream; on loss, back
// off and start again); each upstream stream also has a sender goroutine
// draining its queue. mu guards the tracker, up and gen, so a request is
// either covered by the subscriptions re-sent on a new stream or queued
// after them, never lost between the two. Nothing blocks on the network
// while holding mu.
type session struct {
	p     *Proxy
	proto protocol
	down  grpc.ServerStream
	log   *zap.Logger

	mu  sync.Mutex
	tr  tracker
	up  *sender // feeds the current upstream stream; nil between streams
	gen uint64  // counts upstream streams opened
	own []*ownSub
}

// serveStream is the handler of both ADS methods.
func (p *Proxy) serveStream(ds grpc.ServerStream, proto protocol) error {
	id := p.streamID.Add(1)
	s := &session{
		p:     p,
		proto: proto,
		down:  ds,
		tr:    proto.newTracker(),
		own:   p.ownSubs(),
		log:   p.log.With(zap.Uint64(logkeys.Stream, id), zap.String(logkeys.Protocol, proto.name)),
	}
	gauge := p.metrics.streams.WithLabelValues(proto.name)
	gauge.Inc()
	defer gauge.Dec()
	s.log.Debug("downstream stream opened")

	ctx, cancel := context.WithCancel(ds.Context())
	defer cancel()
	upDone := make(chan error, 1)
	go func() { upDone <- s.runUpstream(ctx) }()
	readDone := make(chan error, 1)
	go func() { readDone <- s.readDownstream() }()

	// The handler returns only after both goroutines, so neither touches
	// the stream once gRPC has finished it.
	select {
	case err := <-readDone:
		// The client closed its side or broke the stream: end the upstream
		// stream with it.
		cancel()
		<-upDone
		s.log.Debug("downstream stream closed", zap.Error(err))
		return err
	case err := <-upDone:
		// Only a failed send downstream ends the upstream loop first, and
		// that means the stream is gone: the reader ends with it.
		<-readDone
		s.log.Debug("downstream stream lost", zap.Error(err))
		return err
	}
}

// readDownstream forwards requests until the client ends the stream. It
// returns nil on a clean end, a status error for a bad request.
func (s *session) readDownstream() error {
	for {
		f := &frame{}
		if err := s.down.RecvMsg(f); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		err := s.forwardRequest(f)
		f.free()
		if err != nil {
			return err
		}
	}
}

func (s *session) forwardRequest(f *frame) error {
	raw := f.data.Materialize()
	s.mu.Lock()
	defer s.mu.Unlock()
	v, rewritten, err := s.tr.request(raw, s.gen)
	if err != nil {
		s.p.metrics.rejectedRequests.Inc()
		s.log.Warn("rejected malformed downstream request", zap.Error(err))
		return status.Errorf(codes.InvalidArgument, "xds proxy: %v", err)
	}
	switch v {
	case drop:
		s.p.metrics.droppedRequests.Inc()
		s.log.Debug("dropped a request that answers a lost upstream stream")
		return nil
	case rewrite:
		s.p.metrics.rewrittenRequests.Inc()
	}
	if s.up == nil {
		// No upstream stream now: the next one gets this subscription from
		// the tracker.
		return nil
	}
	if v == rewrite {
		s.up.enqueue(bytesFrame(rewritten))
	} else {
		f.data.Ref() // the queue's own reference
		s.up.enqueue(&frame{data: f.data})
	}
	if len(s.own) > 0 {
		s.subscribeOwn()
	}
	return nil
}

// errDownstream wraps a failure to send to the client, which ends the session.
type errDownstream struct{ err error }

func (e *errDownstream) Error() string { return "sending downstream: " + e.err.Error() }
func (e *errDownstream) Unwrap() error { return e.err }

// runUpstream keeps an upstream stream going until ctx ends. It returns nil
// when ctx ends and an error only when the client can no longer be sent to.
func (s *session) runUpstream(ctx context.Context) error {
	failures := 0
	for attempt := 0; ; attempt++ {
		answered, err := s.upstreamOnce(ctx, attempt)
		if ctx.Err() != nil {
			return nil
		}
		var de *errDownstream
		if errors.As(err, &de) {
			return err
		}
		code := status.Code(err)
		if err != nil && code != codes.OK {
			s.p.metrics.failures.WithLabelValues(code.String()).Inc()
			msg := err.Error()
			s.p.lastErr.Store(&msg)
		}
		if answered {
			failures = 0
		}
		delay := backoff.Policy{Base: s.p.cfg.InitialBackoff, Cap: s.p.cfg.MaxBackoff}.Delay(failures, s.p.cfg.Rand())
		failures++
		s.log.Info("upstream stream ended, reconnecting",
			zap.Int(logkeys.Attempt, attempt+1), zap.Duration(logkeys.Backoff, delay),
			zap.String(logkeys.Code, code.String()), zap.Error(err))
		t := s.p.cfg.Clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// upstreamOnce opens one upstream stream, restores the subscriptions and
// forwards responses until the stream ends. answered says whether the
// upstream sent anything.
func (s *session) upstreamOnce(ctx context.Context, attempt int) (answered bool, err error) {
	conn := s.p.conn
	if attempt > 0 {
		// A retry after the proxy's backoff: if the connection is waiting
		// out gRPC's own backoff, connect now instead. gRPC reports the
		// connection as failed until it is ready again, so this stream may
		// still fail at once; the next attempt finds it ready.
		conn.ResetConnectBackoff()
	}
	actx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	us, err := conn.NewStream(actx, s.proto.desc, s.proto.method, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return false, err
	}
	s.p.metrics.connects.Inc()
	if attempt > 0 {
		s.p.metrics.reconnects.Inc()
	}

	snd := newSender(us, fail, s.p.cfg.MaxMessageSize, s.p.metrics)
	go snd.run(actx)
	s.attach(snd)
	defer func() {
		fail(nil)
		<-snd.done
		s.mu.Lock()
		if s.up == snd {
			s.up = nil
		}
		s.mu.Unlock()
	}()

	for {
		f := &frame{}
		if err := us.RecvMsg(f); err != nil {
			if cause := context.Cause(actx); errors.Is(cause, errSendBacklog) {
				return answered, status.Error(codes.ResourceExhausted, cause.Error())
			}
			if errors.Is(err, io.EOF) {
				return answered, nil // the control plane ended the stream cleanly
			}
			return answered, err
		}
		answered = true
		if !s.p.ready.Load() {
			s.p.ready.Store(true)
			s.log.Info("control plane answered", zap.String(logkeys.Upstream, s.p.upstream.Addr))
		}
		n := f.data.Len()
		if len(s.own) > 0 {
			handled, err := s.ownResponse(f, snd)
			if handled || err != nil {
				f.free()
				if err != nil {
					s.log.Warn("dropped malformed upstream response; reconnecting", zap.Int(logkeys.Bytes, n), zap.Error(err))
					return answered, status.Errorf(codes.Internal, "malformed upstream response: %v", err)
				}
				continue
			}
		}
		s.mu.Lock()
		err := s.tr.response(f.data, s.gen)
		s.mu.Unlock()
		if err != nil {
			f.free()
			s.log.Warn("dropped malformed upstream response; reconnecting", zap.Int(logkeys.Bytes, n), zap.Error(err))
			return answered, status.Errorf(codes.Internal, "malformed upstream response: %v", err)
		}
		err = s.down.SendMsg(f)
		f.free()
		if err != nil {
			return answered, &errDownstream{err}
		}
		s.p.metrics.messages.WithLabelValues(toDownstream).Inc()
		s.p.metrics.bytes.WithLabelValues(toDownstream).Add(float64(n))
	}
}

// attach queues the subscriptions for a new upstream stream and makes it the
// one requests are forwarded to. Both happen under mu, so every request is
// either part of the re-sent state or queued after it.
func (s *session) attach(snd *sender) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	reqs, err := s.tr.resubscribe()
	if err != nil {
		// Only a marshalling failure of messages the proxy built; the
		// stream carries on with what the client sends next.
		s.log.Error("restoring subscriptions failed", zap.Error(err))
	}
	for _, b := range reqs {
		snd.enqueue(bytesFrame(b))
	}
	s.up = snd
	if len(reqs) > 0 {
		s.log.Info("restoring subscriptions on a new upstream stream", zap.Int(logkeys.Requests, len(reqs)))
		// The node went out with the first restored request.
		s.subscribeOwn()
	}
}

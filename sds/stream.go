package sds

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"slices"
	"sync"
	"sync/atomic"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/caller"
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

// streamState is the xDS bookkeeping of one stream, guarded by stream.mu.
type streamState struct {
	subscribed bool
	requested  []string // the names of the last accepted request, sorted and unique
	// names are the names served (requested, or the defaults), unique; the
	// stream is a member of the shared watch of each. Only the handler
	// goroutine changes it.
	names   []string
	nonce   string          // nonce of our latest response
	sent    []sentVersion   // version of each name last sent on the stream
	missing map[string]bool // names not available at the last look
	// unwatched are the names whose watch the source refused: they are
	// refused on the stream whatever Secret answers.
	unwatched map[string]bool
	// respond: a request changed the subscription; the next push answers
	// it with every name available, changed or not.
	respond bool
}

// classify applies the xDS stream rules (docs/architecture.md) to req.
func (st *streamState) classify(req *discoveryv3.DiscoveryRequest) action {
	if checkType(req.GetTypeUrl()) != nil {
		return actBadType
	}
	if st.subscribed && req.GetResponseNonce() != "" && req.GetResponseNonce() != st.nonce {
		return actStale
	}
	if !st.subscribed || !sameNames(req.GetResourceNames(), st.requested) {
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

// sameNames reports whether names, as a set, are the sorted and unique
// want. An ACK repeats the names of its request, usually already in order:
// that case allocates nothing.
func sameNames(names, want []string) bool {
	if slices.IsSorted(names) {
		unique := true
		for i := 1; i < len(names) && unique; i++ {
			unique = names[i] != names[i-1]
		}
		if unique {
			return slices.Equal(names, want)
		}
	}
	return slices.Equal(sortedUnique(names), want)
}

func sortedUnique(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
}

// subscribe makes the stream follow names: it joins the shared watch of
// each new name before its secret is read (so no change slips between read
// and watch) and leaves those of names it no longer serves. A name over
// the caller's share of file resources fails the request: the names it
// joined are left and the subscription is unchanged.
func (st *stream) subscribe(requested, names []string) error {
	state := &st.st
	var joined []string
	for _, n := range names {
		if slices.Contains(state.names, n) {
			continue
		}
		refused, err := st.srv.join(watchKey{identity: st.identity, name: n}, st)
		if err != nil {
			for _, j := range joined {
				st.srv.leave(watchKey{identity: st.identity, name: j}, st)
			}
			return err
		}
		joined = append(joined, n)
		if refused {
			if state.unwatched == nil {
				state.unwatched = make(map[string]bool)
			}
			state.unwatched[n] = true
		}
	}
	for _, n := range state.names {
		if !slices.Contains(names, n) {
			st.srv.leave(watchKey{identity: st.identity, name: n}, st)
			state.sent = slices.DeleteFunc(state.sent, func(v sentVersion) bool { return v.name == n })
			delete(state.missing, n)
			delete(state.unwatched, n)
		}
	}
	state.subscribed = true
	state.requested = sortedUnique(requested)
	state.names = names
	return nil
}

// unwatchAll leaves every shared watch of the stream. Only the handler
// goroutine calls it, as it returns.
func (st *stream) unwatchAll() {
	for _, n := range st.st.names {
		st.srv.leave(watchKey{identity: st.identity, name: n}, st)
	}
}

// sentVersion is the version of a name last sent on a stream. A stream
// serves a few names: a slice is smaller than a map and as quick.
type sentVersion struct {
	name    string
	version uint64
}

// sentOf returns the version last sent under name.
func (st *streamState) sentOf(name string) (uint64, bool) {
	for _, v := range st.sent {
		if v.name == name {
			return v.version, true
		}
	}
	return 0, false
}

func (st *streamState) setSent(name string, version uint64) {
	for i := range st.sent {
		if st.sent[i].name == name {
			st.sent[i].version = version
			return
		}
	}
	st.sent = append(st.sent, sentVersion{name: name, version: version})
}

// changed reports whether an available secret differs from what the stream
// last sent under its name. secrets[i] is nil for a name not available now.
func (st *streamState) changed(names []string, secrets []*secretmanager.Secret) bool {
	for i, s := range secrets {
		if s == nil {
			continue
		}
		if v, ok := st.sentOf(names[i]); !ok || v != s.Version {
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

func (l streamLog) Debug(msg string, fields ...zap.Field) { l.log(zap.DebugLevel, msg, fields) }
func (l streamLog) Info(msg string, fields ...zap.Field)  { l.log(zap.InfoLevel, msg, fields) }
func (l streamLog) Warn(msg string, fields ...zap.Field)  { l.log(zap.WarnLevel, msg, fields) }

func (l streamLog) log(lvl zapcore.Level, msg string, fields []zap.Field) {
	if ce := l.check(lvl, msg); ce != nil {
		l.write(ce, fields...)
	}
}

// check and write split a log call, so that a hot path builds its fields
// only when the entry is logged.
func (l streamLog) check(lvl zapcore.Level, msg string) *zapcore.CheckedEntry {
	return l.base.Check(lvl, msg)
}

func (l streamLog) write(ce *zapcore.CheckedEntry, fields ...zap.Field) {
	ce.Write(append(fields, zap.Uint64(logkeys.Stream, l.id))...)
}

// stream is one StreamSecrets stream. The gRPC handler goroutine reads
// requests and acts on them; every response (the answer to a request or a
// change) is sent by a push goroutine, started by kick and ending once the
// stream is up to date, so a waiting stream holds one goroutine. mu serialises the two: it
// guards st and every Send.
type stream struct {
	srv      *Server
	ctx      context.Context
	grpc     secretv3.SecretDiscoveryService_StreamSecretsServer
	log      streamLog
	identity pki.Identity // the caller's, which decides what a name means
	caller   string       // callerKey of the stream's context

	mu  sync.Mutex
	st  streamState
	err error // a push's failure; the stream ends with it

	closed  atomic.Bool // the handler returned: nothing more is sent
	dirty   atomic.Bool // a watched secret changed since the last push began
	pushing atomic.Bool // a push goroutine runs
}

// StreamSecrets serves one SDS stream: this goroutine reads requests and
// acts on them; responses are sent by the stream's push goroutine.
func (s *Server) StreamSecrets(gs secretv3.SecretDiscoveryService_StreamSecretsServer) error {
	ctx := gs.Context()
	release, err := s.admit(ctx)
	if err != nil {
		return err
	}
	defer release()
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()

	st := &stream{
		srv:      s,
		ctx:      ctx,
		grpc:     gs,
		log:      streamLog{base: s.log, id: s.streamIDs.Add(1)},
		identity: identityOf(ctx),
		caller:   callerKey(ctx),
	}
	err = st.serve()
	st.closed.Store(true)
	st.unwatchAll()
	if err != nil {
		s.countError(err)
		if c := status.Code(err); c != codes.Canceled {
			st.log.Warn("SDS stream ended with an error", zap.String(logkeys.Code, c.String()), zap.Error(err))
		}
	}
	return err
}

// serve reads and answers requests until the stream ends.
func (st *stream) serve() error {
	var in wireRequest
	for {
		recvErr := st.grpc.RecvMsg(&in)
		st.mu.Lock()
		err := st.err
		if err == nil && recvErr == nil {
			err = st.srv.handleRequest(st, in.req)
		}
		st.mu.Unlock()
		switch {
		case err != nil:
			return err
		case recvErr != nil:
			return endOfRecv(recvErr)
		}
	}
}

// kick schedules a push: it starts the stream's push goroutine unless one
// runs, which then pushes again. It never blocks, so one watch's goroutine
// serves any number of streams and a slow client delays only itself.
func (st *stream) kick() {
	st.dirty.Store(true)
	if st.pushing.CompareAndSwap(false, true) {
		go st.pushLoop()
	}
}

// pushLoop pushes until no change is pending. Changes that arrive during a
// push merge into one more push of the newest versions.
func (st *stream) pushLoop() {
	for {
		for st.dirty.Swap(false) {
			st.pushOnce()
		}
		st.pushing.Store(false)
		// A kick between the last Swap and the Store saw a push running
		// and started none: take it over unless another kick did.
		if !st.dirty.Load() || !st.pushing.CompareAndSwap(false, true) {
			return
		}
	}
}

func (st *stream) pushOnce() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.err != nil || st.closed.Load() {
		return
	}
	if err := st.srv.push(st); err != nil {
		// The handler is waiting for the client; the stream ends with err
		// when its next request or its end arrives.
		st.err = err
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

// handleRequest acts on one request. Called with str.mu held.
func (s *Server) handleRequest(str *stream, req *discoveryv3.DiscoveryRequest) error {
	st, log := &str.st, str.log
	act := st.classify(req)
	if req.GetErrorDetail() != nil && (act == actNACK || act == actRespond) {
		s.metrics.nacks.Inc()
		log.Warn("client rejected secrets",
			zap.Strings(logkeys.Names, req.GetResourceNames()),
			zap.String(logkeys.Nonce, req.GetResponseNonce()),
			zap.String(logkeys.ErrorDetail, req.GetErrorDetail().GetMessage()))
	}
	switch act {
	case actBadType:
		return checkType(req.GetTypeUrl())
	case actStale:
		s.metrics.stale.Inc()
		log.Debug("stale SDS request ignored", zap.String(logkeys.Nonce, req.GetResponseNonce()))
		return nil
	case actNACK:
		return nil
	case actACK:
		s.metrics.acks.Inc()
		if ce := log.check(zap.DebugLevel, "secrets acknowledged"); ce != nil {
			log.write(ce, zap.String(logkeys.Version, req.GetVersionInfo()), zap.String(logkeys.Nonce, req.GetResponseNonce()))
		}
		return nil
	}
	names, err := s.names(req.GetResourceNames())
	if err != nil {
		return err
	}
	if err := str.subscribe(req.GetResourceNames(), names); err != nil {
		return err
	}
	// A name that can never be served ends the stream now; the answer
	// itself is sent by the push goroutine, whose stack the encoding and
	// sending grow, not this one's, which the stream keeps while it waits.
	if _, err := s.available(str.identity, st, names, log); err != nil {
		return err
	}
	st.respond = true
	str.kick()
	return nil
}

// push answers the latest request, or sends the subscribed secrets again if
// any of them changed. Called with str.mu held.
func (s *Server) push(str *stream) error {
	if err := str.ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	st := &str.st
	secrets, err := s.available(str.identity, st, st.names, str.log)
	if err != nil {
		return err
	}
	if st.respond {
		st.respond = false
		return s.send(str, secrets, s.metrics.pushRequest)
	}
	if !st.changed(st.names, secrets) {
		return nil
	}
	return s.send(str, secrets, s.metrics.pushUpdate)
}

// available reads every name of the stream on its own, without waiting:
// secrets[i] is nil for a name that is not available now (no certificate
// yet, CA down, expired, a file not readable yet). Such a name is left out
// of the responses, logged and counted when it becomes unavailable, and
// pushed as soon as its source signals it; the other names are served
// meanwhile. A name that can never be served (unknown, or no identity for
// the caller) fails the stream with InvalidArgument naming it, as does a
// name whose watch the source refused, even if Secret would serve it now
// (the refusal's reason, when Secret still gives it, or the source's log
// says which limit or file was at fault): a name is never served unwatched.
func (s *Server) available(id pki.Identity, st *streamState, names []string, log streamLog) ([]*secretmanager.Secret, error) {
	out := make([]*secretmanager.Secret, len(names))
	for i, name := range names {
		sec, err := s.cfg.Secrets.Current(id, name)
		if permanent(err) {
			return nil, status.Errorf(codes.InvalidArgument, "resource %.200q cannot be served: %v", name, err)
		}
		if st.unwatched[name] {
			return nil, status.Errorf(codes.InvalidArgument,
				"resource %.200q cannot be served: its source refused to watch it (a bad file, or the limit of file resources held at once; the agent's log says which)", name)
		}
		if err == nil {
			out[i] = sec
			delete(st.missing, name)
			continue
		}
		if !st.missing[name] {
			if st.missing == nil {
				st.missing = make(map[string]bool)
			}
			st.missing[name] = true
			s.metrics.unavailable.Inc()
			log.Info("resource not available yet; the others are served and it is pushed once it is",
				zap.String(logkeys.Name, name), zap.Error(err))
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
func (s *Server) send(str *stream, secrets []*secretmanager.Secret, counter prometheus.Counter) error {
	st, log := &str.st, str.log
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
	fields := make([]mem.Buffer, len(have))
	for i, sec := range have {
		fields[i] = s.encoded.field(names[i], sec)
	}
	version, nonce := s.nextVersion(), rand.Text()
	if err := str.grpc.SendMsg(newWireResponse(version, nonce, fields)); err != nil {
		return err
	}
	st.nonce = nonce
	for i, sec := range have {
		st.setSent(names[i], sec.Version)
	}
	counter.Inc()
	if ce := log.check(zap.DebugLevel, "secrets sent"); ce != nil {
		reason := pushUpdate
		if counter == s.metrics.pushRequest {
			reason = pushRequest
		}
		log.write(ce, zap.Strings(logkeys.Names, names), zap.String(logkeys.Version, version),
			zap.String(logkeys.Nonce, nonce), zap.String(logkeys.Reason, reason))
	}
	return nil
}

// admit takes a stream's place within MaxStreams and, for a caller the
// socket server resolved (node mode), MaxStreamsPerCaller, or refuses it
// with ResourceExhausted naming the limit; release gives the place back.
func (s *Server) admit(ctx context.Context) (release func(), err error) {
	release, r, err := s.streams.Admit(ctx)
	if err != nil {
		info, _ := caller.FromContext(ctx)
		s.metrics.refused.WithLabelValues(r.Reason).Inc()
		s.log.Warn("SDS stream refused: "+r.Cause.Error(), zap.String(logkeys.Caller, info.Key()), zap.String(logkeys.Reason, r.Reason), zap.Int(logkeys.Limit, r.Limit), zap.Error(err))
	}
	return release, err
}

package workloadapi

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/internal/uds/streamlimit"
	"github.com/meshagent/meshagent/secretmanager"
)

// The security header every Workload API call must carry, as the SPIFFE
// Workload API standard requires.
const (
	headerKey   = "workload.spiffe.io"
	headerValue = "true"
)

// SecretSource is what the server needs from the secret manager. id is the
// caller's identity, as the socket server resolved it (caller.Info.Identity;
// zero for the agent's own): "default" is its certificate, "ROOTCA" the
// trust bundle.
type SecretSource interface {
	// Secret returns the current secret for name, waiting (bounded by ctx)
	// while it is not available yet.
	Secret(ctx context.Context, id pki.Identity, name string) (*secretmanager.Secret, error)
	// Watch signals, on a channel with a one-slot buffer, each time the secret
	// under name is replaced; the function ends the subscription.
	Watch(id pki.Identity, name string) (<-chan struct{}, func())
}

// Config describes a Workload API server. The bounds are required: their
// values are settings', passed in by internal/app.
type Config struct {
	// Secrets provides the caller's certificate and the trust bundle. Required.
	Secrets SecretSource
	// MaxStreams bounds the streams (FetchX509SVID and FetchX509Bundles) open
	// at once; one over the limit is refused with ResourceExhausted.
	// Required.
	MaxStreams int
	// MaxStreamsPerCaller bounds the streams one caller (a pod, or an
	// identity, as the socket server's resolver named it) holds open at once,
	// so that no pod on a node can take every stream; one over the limit is
	// refused with ResourceExhausted. Callers the agent does not tell apart
	// (a sidecar's: one workload) are bounded by MaxStreams only. Required.
	MaxStreamsPerCaller int
	// Callers, when set, is the per-caller stream count shared with the
	// other service on the socket, so a pod's SDS and Workload API streams
	// count together against MaxStreamsPerCaller. Nil: a count of its own.
	Callers *streamlimit.Callers
	// LimitNames are what a refused stream is told to raise: the settings
	// behind MaxStreams and MaxStreamsPerCaller. Empty names are left out.
	LimitNames streamlimit.Names
	// Logger receives the server's logs. Nil means no logs.
	Logger *zap.Logger
	// Registerer receives the metrics. Nil means they are not registered.
	Registerer prometheus.Registerer
}

// Server serves the SPIFFE Workload API's X.509 methods. Create it with New
// and serve it on a gRPC server with Register.
type Server struct {
	workload.UnimplementedSpiffeWorkloadAPIServer

	cfg     Config
	log     *zap.Logger
	metrics *metrics

	streamIDs atomic.Uint64

	streams *streamlimit.Limit // streams being served
}

// New checks cfg and returns a server. It starts nothing.
func New(cfg Config) (*Server, error) {
	if cfg.Secrets == nil {
		return nil, errors.New("workload API server: no secret source")
	}
	if cfg.MaxStreams <= 0 {
		return nil, fmt.Errorf("workload API server: Config.MaxStreams %d is not positive", cfg.MaxStreams)
	}
	if cfg.MaxStreamsPerCaller <= 0 {
		return nil, fmt.Errorf("workload API server: Config.MaxStreamsPerCaller %d is not positive", cfg.MaxStreamsPerCaller)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, log: cfg.Logger.Named("workloadapi"), metrics: m,
		streams: &streamlimit.Limit{Max: cfg.MaxStreams, PerCaller: cfg.MaxStreamsPerCaller, Callers: cfg.Callers,
			Service: "Workload API", Names: cfg.LimitNames}}, nil
}

// Register adds the SpiffeWorkloadAPI service to gs.
func (s *Server) Register(gs *grpc.Server) {
	workload.RegisterSpiffeWorkloadAPIServer(gs, s)
}

// FetchX509SVID streams the caller's X.509-SVID (its SPIFFE ID, certificate
// chain, PKCS#8 key and trust bundle), again whenever the certificate or the
// bundle changes.
func (s *Server) FetchX509SVID(_ *workload.X509SVIDRequest, stream grpc.ServerStreamingServer[workload.X509SVIDResponse]) error {
	ctx := stream.Context()
	if err := s.checkHeader(ctx, methodX509SVID); err != nil {
		return err
	}
	release, err := s.acquire(ctx, methodX509SVID)
	if err != nil {
		return err
	}
	defer release()
	return s.ended(methodX509SVID, s.follow(ctx, identityOf(ctx), methodX509SVID, []string{secretmanager.WorkloadCertName, secretmanager.RootCertName},
		func(secrets []*secretmanager.Secret) error {
			resp, err := svidResponse(secrets[0], secrets[1])
			if err != nil {
				return err
			}
			return stream.Send(resp)
		}))
}

// FetchX509Bundles streams the trust bundle of the caller's trust domain,
// again whenever it changes.
func (s *Server) FetchX509Bundles(_ *workload.X509BundlesRequest, stream grpc.ServerStreamingServer[workload.X509BundlesResponse]) error {
	ctx := stream.Context()
	if err := s.checkHeader(ctx, methodX509Bundles); err != nil {
		return err
	}
	release, err := s.acquire(ctx, methodX509Bundles)
	if err != nil {
		return err
	}
	defer release()
	// The trust domain is the caller's: that of its identity, which does
	// not change while the stream lasts.
	id := identityOf(ctx)
	cert, err := s.read(ctx, id, secretmanager.WorkloadCertName)
	if err != nil {
		return s.ended(methodX509Bundles, err)
	}
	_, td, err := spiffeIdentity(cert)
	if err != nil {
		return s.ended(methodX509Bundles, err)
	}
	return s.ended(methodX509Bundles, s.follow(ctx, id, methodX509Bundles, []string{secretmanager.RootCertName},
		func(secrets []*secretmanager.Secret) error {
			resp, err := bundlesResponse(td, secrets[0])
			if err != nil {
				return err
			}
			return stream.Send(resp)
		}))
}

// unimplemented is the answer to the methods of the Workload API that the
// agent does not serve.
func unimplemented(method string) error {
	return status.Errorf(codes.Unimplemented,
		"%s is not served: this agent's Workload API serves X.509-SVIDs only (FetchX509SVID, FetchX509Bundles), no JWT- or WIT-SVIDs", method)
}

// FetchJWTSVID is not served: the mesh CAs issue X.509 certificates only.
func (s *Server) FetchJWTSVID(ctx context.Context, _ *workload.JWTSVIDRequest) (*workload.JWTSVIDResponse, error) {
	if err := s.checkHeader(ctx, "FetchJWTSVID"); err != nil {
		return nil, err
	}
	return nil, unimplemented("FetchJWTSVID")
}

// FetchJWTBundles is not served.
func (s *Server) FetchJWTBundles(_ *workload.JWTBundlesRequest, stream grpc.ServerStreamingServer[workload.JWTBundlesResponse]) error {
	if err := s.checkHeader(stream.Context(), "FetchJWTBundles"); err != nil {
		return err
	}
	return unimplemented("FetchJWTBundles")
}

// ValidateJWTSVID is not served.
func (s *Server) ValidateJWTSVID(ctx context.Context, _ *workload.ValidateJWTSVIDRequest) (*workload.ValidateJWTSVIDResponse, error) {
	if err := s.checkHeader(ctx, "ValidateJWTSVID"); err != nil {
		return nil, err
	}
	return nil, unimplemented("ValidateJWTSVID")
}

// FetchWITSVID is not served.
func (s *Server) FetchWITSVID(_ *workload.WITSVIDRequest, stream grpc.ServerStreamingServer[workload.WITSVIDResponse]) error {
	if err := s.checkHeader(stream.Context(), "FetchWITSVID"); err != nil {
		return err
	}
	return unimplemented("FetchWITSVID")
}

// FetchWITBundles is not served.
func (s *Server) FetchWITBundles(_ *workload.WITBundlesRequest, stream grpc.ServerStreamingServer[workload.WITBundlesResponse]) error {
	if err := s.checkHeader(stream.Context(), "FetchWITBundles"); err != nil {
		return err
	}
	return unimplemented("FetchWITBundles")
}

// checkHeader refuses with InvalidArgument a call without exactly one
// workload.spiffe.io: true metadata entry, as SPIRE does (the header keeps a
// browser tricked into calling the socket out).
func (s *Server) checkHeader(ctx context.Context, method string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(headerKey); len(v) == 1 && v[0] == headerValue {
		return nil
	}
	s.metrics.refused.WithLabelValues(refusedHeader).Inc()
	s.log.Warn("workload API call refused: security header missing", zap.String(logkeys.Method, method), callerField(ctx))
	return status.Error(codes.InvalidArgument, "security header missing from request: the Workload API needs the gRPC metadata workload.spiffe.io: true")
}

// identityOf returns the caller identity ctx carries, as the socket server
// resolved it (zero for the agent's own): the one place the server reads it.
func identityOf(ctx context.Context) pki.Identity {
	info, _ := caller.FromContext(ctx)
	return info.Identity
}

func callerField(ctx context.Context) zap.Field {
	info, ok := caller.FromContext(ctx)
	if !ok {
		return zap.Skip()
	}
	return zap.Stringer(logkeys.Cred, info.Cred)
}

// acquire takes a stream's place within the limits, or refuses the stream
// with ResourceExhausted naming the limit. The function gives it back.
func (s *Server) acquire(ctx context.Context, method string) (func(), error) {
	release, r, err := s.streams.Admit(ctx)
	if err != nil {
		s.metrics.refused.WithLabelValues(r.Reason).Inc()
		s.log.Warn("workload API stream refused", zap.String(logkeys.Method, method), callerField(ctx), zap.Error(err))
		return nil, err
	}
	s.metrics.streams.WithLabelValues(method).Inc()
	return func() {
		s.metrics.streams.WithLabelValues(method).Dec()
		release()
	}, nil
}

// follow watches names, then reads them and sends them with send, and again
// each time one of them changes to a version the stream has not been sent.
// It returns when ctx ends or a send fails. A first read that fails ends the
// stream; a later one is logged and the client keeps what it holds until the
// next change.
func (s *Server) follow(ctx context.Context, ident pki.Identity, method string, names []string, send func([]*secretmanager.Secret) error) error {
	// Watch before reading, so no change slips between the two.
	var w0, w1 <-chan struct{} // one or two names, as the methods use
	for i, name := range names {
		ch, cancel := s.cfg.Secrets.Watch(ident, name)
		defer cancel()
		if i == 0 {
			w0 = ch
		} else {
			w1 = ch
		}
	}
	id := s.streamIDs.Add(1)
	var sent []uint64
	for {
		secrets, err := s.readAll(ctx, ident, names)
		switch {
		case err != nil && sent == nil:
			return err
		case err != nil:
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			s.log.Warn("workload API update not sent", zap.Uint64(logkeys.Stream, id), zap.String(logkeys.Method, method), zap.Error(err))
		case !secret.SameVersions(secrets, sent):
			if err := send(secrets); err != nil {
				return err
			}
			reason := pushUpdate
			if sent == nil {
				reason = pushFirst
			}
			sent = sent[:0]
			for _, sec := range secrets {
				sent = append(sent, sec.Version)
			}
			s.metrics.pushes.WithLabelValues(method, reason).Inc()
			s.log.Debug("workload API response sent", zap.Uint64(logkeys.Stream, id), zap.String(logkeys.Method, method),
				zap.String(logkeys.Reason, reason), callerField(ctx))
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-w0:
		case <-w1:
		}
	}
}

func (s *Server) readAll(ctx context.Context, ident pki.Identity, names []string) ([]*secretmanager.Secret, error) {
	out := make([]*secretmanager.Secret, len(names))
	for i, name := range names {
		sec, err := s.read(ctx, ident, name)
		if err != nil {
			return nil, err
		}
		out[i] = sec
	}
	return out, nil
}

// read asks the source for name and gives its failures the codes of the
// SPIFFE Workload Endpoint standard (its list of error codes): a caller the
// agent has no identity for, or that is not entitled to name
// (secretmanager.ErrNoIdentity, ErrUnknownResource), gets PermissionDenied,
// the standard's "not entitled to an SVID" (the workload may have started
// before its identity was provisioned: clients retry with backoff, and
// SPIRE and go-spiffe's own test server answer so); any other failure is
// Unavailable (the agent cannot answer now: retry); the end of ctx keeps
// ctx's code.
func (s *Server) read(ctx context.Context, ident pki.Identity, name string) (*secretmanager.Secret, error) {
	sec, err := s.cfg.Secrets.Secret(ctx, ident, name)
	if err == nil {
		return sec, nil
	}
	what := "X.509-SVID"
	if name == secretmanager.RootCertName {
		what = "trust bundle"
	}
	switch {
	case errors.Is(err, secretmanager.ErrNoIdentity) || errors.Is(err, secretmanager.ErrUnknownResource):
		return nil, status.Errorf(codes.PermissionDenied, "no %s for this caller: %v", what, err)
	case ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return nil, status.FromContextError(err).Err()
	}
	return nil, status.Errorf(codes.Unavailable, "%s not available: %v", what, err)
}

// ended counts and logs the error a stream ended with, and returns it.
func (s *Server) ended(method string, err error) error {
	code := status.Code(err)
	if err == nil || code == codes.Canceled {
		return err
	}
	s.metrics.errors.WithLabelValues(method, code.String()).Inc()
	s.log.Warn("workload API stream ended with an error", zap.String(logkeys.Method, method), zap.String(logkeys.Code, code.String()), zap.Error(err))
	return err
}

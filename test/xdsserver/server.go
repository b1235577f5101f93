package xdsserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/test/loopback"
)

// Config describes a test control plane. Zero values get the defaults noted.
type Config struct {
	// CA issues the serving certificate. Required unless Plaintext is set.
	CA *localca.CA
	// ServerNames are the DNS names in the serving certificate, besides the
	// IP SANs 127.0.0.1 and ::1. Default "localhost".
	ServerNames []string
	// Tokens are the bearer tokens accepted in "authorization: Bearer <t>".
	// Empty means no token is required (and any token is recorded).
	Tokens []string
	// Addr is where to listen. Default "127.0.0.1:0".
	Addr string
	// Plaintext serves without TLS, like istiod's port 15010.
	Plaintext bool
	// ClientCAs, when set, makes the server ask for a client certificate and
	// verify any that is offered against this pool (a client without one is
	// still served). A verified client certificate authenticates the stream
	// whatever its token, as istiod's client-certificate authenticator,
	// which comes before its token authenticators.
	ClientCAs *x509.CertPool
	// OpaqueTypes are type URLs served from caches of their own, whatever
	// the resources are (any proto message; istiod's ProxyConfig is one):
	// see SetOpaque. Other types are served from the snapshot cache.
	OpaqueTypes []string
	// ADS makes the snapshot cache hold back a SotW answer until every named
	// resource is in the snapshot (go-control-plane's ADS mode).
	ADS bool
}

// Counts says how many ADS streams the server has seen.
type Counts struct {
	// Opened counts every stream that arrived, rejected or not.
	Opened int
	// Rejected counts streams refused by the token check.
	Rejected int
	// Active counts accepted streams whose handler is still running.
	Active int
}

// Call records one stream as the server saw it.
type Call struct {
	// Method is the full gRPC method name.
	Method string
	// Metadata is the request metadata (authorization included).
	Metadata metadata.MD
	// PeerCertificates is the client's certificate chain, if it sent one.
	PeerCertificates []*x509.Certificate
	// Requests are the SotW requests, exactly as received.
	Requests []*discovery.DiscoveryRequest
	// DeltaRequests are the delta requests, exactly as received.
	DeltaRequests []*discovery.DeltaDiscoveryRequest
	// Err is the status the server ended the stream with; nil while it runs
	// or when it ended cleanly.
	Err error
	// Done is true once the handler returned.
	Done bool
}

// Server is a running test control plane.
type Server struct {
	cfg   Config
	cache cache.SnapshotCache
	// served is what the server answers from: the snapshot cache, and a
	// linear cache per opaque type.
	muxed  cache.Cache
	opaque map[string]*cache.LinearCache
	creds  credentials.TransportCredentials

	mu      sync.Mutex
	addr    string
	grpc    *grpc.Server
	cancel  context.CancelFunc
	served  chan struct{}
	stopped bool
	counts  Counts
	calls   []*Call
}

// Start runs a server for the rest of the test; it is stopped at cleanup.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if len(cfg.ServerNames) == 0 {
		cfg.ServerNames = []string{"localhost"}
	}
	s := &Server{cfg: cfg, cache: cache.NewSnapshotCache(cfg.ADS, cache.IDHash{}, nil)}
	s.muxed = s.cache
	if len(cfg.OpaqueTypes) > 0 {
		s.opaque = map[string]*cache.LinearCache{}
		caches := map[string]cache.Cache{"": s.cache}
		for _, typeURL := range cfg.OpaqueTypes {
			l := cache.NewLinearCache(typeURL)
			s.opaque[typeURL], caches[typeURL] = l, l
		}
		classify := func(typeURL string) string {
			if _, ok := s.opaque[typeURL]; ok {
				return typeURL
			}
			return ""
		}
		s.muxed = &cache.MuxCache{
			Classify:      func(r *cache.Request) string { return classify(r.GetTypeUrl()) },
			ClassifyDelta: func(r *cache.DeltaRequest) string { return classify(r.GetTypeUrl()) },
			Caches:        caches,
		}
	}
	if !cfg.Plaintext {
		if cfg.CA == nil {
			t.Fatal("xdsserver: a CA is required unless Plaintext is set")
		}
		cert, err := cfg.CA.ServerTLS(cfg.ServerNames, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback})
		if err != nil {
			t.Fatalf("xdsserver: serving certificate: %v", err)
		}
		tc := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
		if cfg.ClientCAs != nil {
			tc.ClientAuth = tls.VerifyClientCertIfGiven
			tc.ClientCAs = cfg.ClientCAs
		}
		s.creds = credentials.NewTLS(tc)
	}
	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		t.Fatalf("xdsserver: listen: %v", err)
	}
	s.addr = lis.Addr().String()
	s.serve(lis)
	t.Cleanup(s.Stop)
	return s
}

// Addr is the host:port the server listens on.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Cache is the snapshot cache the server answers from.
func (s *Server) Cache() cache.SnapshotCache { return s.cache }

// SetSnapshot publishes snap for the node with the given ID.
func (s *Server) SetSnapshot(nodeID string, snap cache.ResourceSnapshot) error {
	if err := s.cache.SetSnapshot(context.Background(), nodeID, snap); err != nil {
		return fmt.Errorf("setting snapshot for %s: %w", nodeID, err)
	}
	return nil
}

// SetResources publishes the given resources, keyed by type URL (see
// go-control-plane's resource package), under one version for the node.
func (s *Server) SetResources(nodeID, version string, res map[resource.Type][]types.Resource) error {
	snap, err := cache.NewSnapshot(version, res)
	if err != nil {
		return fmt.Errorf("building snapshot %s: %w", version, err)
	}
	return s.SetSnapshot(nodeID, snap)
}

// SetOpaque replaces every resource of an opaque type (Config.OpaqueTypes)
// with resources, keyed by name, under a new version; clients subscribed
// to the type get them at once.
func (s *Server) SetOpaque(typeURL string, resources map[string]proto.Message) error {
	l, ok := s.opaque[typeURL]
	if !ok {
		return fmt.Errorf("xdsserver: %s is not one of Config.OpaqueTypes", typeURL)
	}
	res := make(map[string]types.Resource, len(resources))
	for name, m := range resources {
		res[name] = m
	}
	l.SetResources(res)
	return nil
}

// Streams returns the stream counts so far.
func (s *Server) Streams() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// Calls returns a copy of the record of every stream, oldest first.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Call, len(s.calls))
	for i, c := range s.calls {
		out[i] = *c
		out[i].Metadata = c.Metadata.Copy()
		out[i].Requests = slices.Clone(c.Requests)
		out[i].DeltaRequests = slices.Clone(c.DeltaRequests)
	}
	return out
}

// LastMetadata returns the metadata of the most recent stream, or nil.
func (s *Server) LastMetadata() metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.calls) == 0 {
		return nil
	}
	return s.calls[len(s.calls)-1].Metadata.Copy()
}

// WaitStreams polls Streams until cond holds or the timeout passes, and
// reports whether it held.
func (s *Server) WaitStreams(timeout time.Duration, cond func(Counts) bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond(s.Streams()) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Stop closes the listener and every stream. It is safe to call twice.
func (s *Server) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	g, cancel, served := s.grpc, s.cancel, s.served
	s.mu.Unlock()
	g.Stop()
	cancel()
	<-served
}

// Restart stops the server, dropping every connection, and serves again on
// the same address with the same snapshot cache.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	addr := s.Addr()
	lis, err := loopback.ListenAgain(addr, 5*time.Second)
	if err != nil {
		t.Fatalf("xdsserver: %v", err)
	}
	s.mu.Lock()
	s.stopped = false
	s.mu.Unlock()
	s.serve(lis)
}

func (s *Server) serve(lis net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	opts := []grpc.ServerOption{
		grpc.StreamInterceptor(s.intercept),
		grpc.WaitForHandlers(true),
	}
	if s.creds != nil {
		opts = append(opts, grpc.Creds(s.creds))
	}
	g := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, s.muxed, nil))
	served := make(chan struct{})
	s.mu.Lock()
	s.grpc, s.cancel, s.served = g, cancel, served
	s.mu.Unlock()
	go func() {
		defer close(served)
		_ = g.Serve(lis)
	}()
}

// intercept records the stream, checks the bearer token and counts.
func (s *Server) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	call := &Call{Method: info.FullMethod, Metadata: md.Copy()}
	verified := false
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			call.PeerCertificates = ti.State.PeerCertificates
			verified = s.cfg.ClientCAs != nil && len(ti.State.VerifiedChains) > 0
		}
	}
	s.mu.Lock()
	s.calls = append(s.calls, call)
	s.counts.Opened++
	var err error
	if !verified {
		err = s.authorize(md)
	}
	if err != nil {
		s.counts.Rejected++
		call.Err, call.Done = err, true
		s.mu.Unlock()
		return err
	}
	s.counts.Active++
	s.mu.Unlock()

	err = handler(srv, &recordingStream{ServerStream: ss, s: s, call: call})

	s.mu.Lock()
	s.counts.Active--
	call.Err, call.Done = err, true
	s.mu.Unlock()
	return err
}

func (s *Server) authorize(md metadata.MD) error {
	if len(s.cfg.Tokens) == 0 {
		return nil
	}
	for _, v := range md.Get("authorization") {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		if ok && slices.Contains(s.cfg.Tokens, tok) {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "missing or unknown bearer token")
}

// recordingStream keeps a copy of every request before the discovery server
// sees (and fills in) it.
type recordingStream struct {
	grpc.ServerStream
	s    *Server
	call *Call
}

func (r *recordingStream) RecvMsg(m any) error {
	if err := r.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	switch req := m.(type) {
	case *discovery.DiscoveryRequest:
		r.call.Requests = append(r.call.Requests, proto.Clone(req).(*discovery.DiscoveryRequest))
	case *discovery.DeltaDiscoveryRequest:
		r.call.DeltaRequests = append(r.call.DeltaRequests, proto.Clone(req).(*discovery.DeltaDiscoveryRequest))
	}
	return nil
}

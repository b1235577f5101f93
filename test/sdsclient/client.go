// Package sdsclient is an Envoy-like SDS client for tests: it dials the
// agent's Unix socket, opens StreamSecrets for some names, acknowledges every
// response the way Envoy does (or lets the test NACK, change names or send a
// stale nonce), and hands the decoded secrets to the test on a channel.
//
// A Stream has one goroutine reading responses; sends are serialised by a
// mutex, so the test may call ACK, NACK and Request from any goroutine.
package sdsclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Client is a connection to an SDS socket.
type Client struct {
	conn *grpc.ClientConn
	sds  secretv3.SecretDiscoveryServiceClient
}

// Dial waits (bounded by ctx) until something accepts connections on the
// socket, then returns a client for it.
func Dial(ctx context.Context, socketPath string) (*Client, error) {
	abs, err := filepath.Abs(socketPath)
	if err != nil {
		return nil, err
	}
	for {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", abs)
		if err == nil {
			_ = conn.Close()
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for SDS socket %s: %w (last error: %v)", abs, ctx.Err(), err)
		case <-time.After(time.Millisecond):
		}
	}
	conn, err := grpc.NewClient("unix://"+abs, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, sds: secretv3.NewSecretDiscoveryServiceClient(conn)}, nil
}

// Close closes the connection and every stream on it.
func (c *Client) Close() error { return c.conn.Close() }

// Response is one decoded DiscoveryResponse.
type Response struct {
	Version string
	Nonce   string
	// Names are the secrets' names in response order.
	Names []string
	// Secrets by name.
	Secrets map[string]*tlsv3.Secret
	Raw     *discoveryv3.DiscoveryResponse
}

// Cert returns the inline chain and key of a TlsCertificate secret.
func (r *Response) Cert(name string) (chain, key []byte, ok bool) {
	tc := r.Secrets[name].GetTlsCertificate()
	if tc == nil {
		return nil, nil, false
	}
	return tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes(), true
}

// TrustedCA returns the inline trusted CA of a ValidationContext secret.
func (r *Response) TrustedCA(name string) ([]byte, bool) {
	vc := r.Secrets[name].GetValidationContext()
	if vc == nil {
		return nil, false
	}
	return vc.GetTrustedCa().GetInlineBytes(), true
}

func decode(resp *discoveryv3.DiscoveryResponse) (*Response, error) {
	if resp.GetTypeUrl() != resourcev3.SecretType {
		return nil, fmt.Errorf("response type %q, want %s", resp.GetTypeUrl(), resourcev3.SecretType)
	}
	out := &Response{Version: resp.GetVersionInfo(), Nonce: resp.GetNonce(), Secrets: map[string]*tlsv3.Secret{}, Raw: resp}
	for i, a := range resp.GetResources() {
		var s tlsv3.Secret
		if err := a.UnmarshalTo(&s); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		out.Names = append(out.Names, s.GetName())
		out.Secrets[s.GetName()] = &s
	}
	return out, nil
}

// Fetch calls FetchSecrets.
func (c *Client) Fetch(ctx context.Context, names ...string) (*Response, error) {
	resp, err := c.sds.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: names})
	if err != nil {
		return nil, err
	}
	return decode(resp)
}

// StreamConfig says how a stream behaves.
type StreamConfig struct {
	// Names are requested in the first request.
	Names []string
	// ManualACK leaves acknowledging to the test; by default every response
	// is acknowledged as soon as it is received, as Envoy does.
	ManualACK bool
	// Buffer is the size of the Responses channel. Default 16.
	Buffer int
}

// Stream is one StreamSecrets call.
type Stream struct {
	cfg       StreamConfig
	stream    secretv3.SecretDiscoveryService_StreamSecretsClient
	cancel    context.CancelFunc
	responses chan *Response
	done      chan struct{}

	sendMu sync.Mutex
	mu     sync.Mutex
	names  []string
	err    error
}

// Stream opens StreamSecrets and sends the first request for cfg.Names.
func (c *Client) Stream(ctx context.Context, cfg StreamConfig) (*Stream, error) {
	if cfg.Buffer <= 0 {
		cfg.Buffer = 16
	}
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.sds.StreamSecrets(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	s := &Stream{cfg: cfg, stream: stream, cancel: cancel, responses: make(chan *Response, cfg.Buffer), done: make(chan struct{}), names: cfg.Names}
	// io.EOF means the server already ended the stream (it may refuse it
	// before reading a request); Recv reports why, through Err.
	if err := s.Request(cfg.Names, "", ""); err != nil && !errors.Is(err, io.EOF) {
		cancel()
		return nil, err
	}
	go s.receive(ctx)
	return s, nil
}

func (s *Stream) receive(ctx context.Context) {
	defer close(s.done)
	for {
		raw, err := s.stream.Recv()
		if err != nil {
			s.fail(err)
			return
		}
		resp, err := decode(raw)
		if err != nil {
			s.fail(err)
			return
		}
		if !s.cfg.ManualACK {
			if err := s.ACK(resp); err != nil {
				s.fail(err)
				return
			}
		}
		select {
		case s.responses <- resp:
		case <-ctx.Done():
			s.fail(ctx.Err())
			return
		}
	}
}

func (s *Stream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// Responses delivers every decoded response in order.
func (s *Stream) Responses() <-chan *Response { return s.responses }

// Done is closed when the stream has ended; Err then says why.
func (s *Stream) Done() <-chan struct{} { return s.done }

// Err returns why the stream ended (a gRPC status error, or io.EOF), or nil
// while it is open.
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// ErrEnded is returned by Next when the stream ended.
var ErrEnded = errors.New("SDS stream ended")

// Next waits for the next response, the end of the stream, or ctx.
func (s *Stream) Next(ctx context.Context) (*Response, error) {
	select {
	case r := <-s.responses:
		return r, nil
	case <-s.done:
		select {
		case r := <-s.responses:
			return r, nil
		default:
		}
		return nil, fmt.Errorf("%w: %w", ErrEnded, s.Err())
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Request sends a raw request for names with the given nonce and version
// (for name changes and stale nonces).
func (s *Stream) Request(names []string, nonce, version string) error {
	return s.send(&discoveryv3.DiscoveryRequest{
		TypeUrl:       resourcev3.SecretType,
		ResourceNames: names,
		ResponseNonce: nonce,
		VersionInfo:   version,
	}, names)
}

// Send sends req as it is (for requests the helpers would not build).
func (s *Stream) Send(req *discoveryv3.DiscoveryRequest) error {
	return s.send(req, req.GetResourceNames())
}

// ACK accepts r for the current names.
func (s *Stream) ACK(r *Response) error {
	names := s.currentNames()
	return s.send(&discoveryv3.DiscoveryRequest{
		TypeUrl:       resourcev3.SecretType,
		ResourceNames: names,
		ResponseNonce: r.Nonce,
		VersionInfo:   r.Version,
	}, names)
}

// NACK rejects r with msg, keeping the previously accepted version
// (lastVersion, empty if none).
func (s *Stream) NACK(r *Response, lastVersion, msg string) error {
	names := s.currentNames()
	return s.send(&discoveryv3.DiscoveryRequest{
		TypeUrl:       resourcev3.SecretType,
		ResourceNames: names,
		ResponseNonce: r.Nonce,
		VersionInfo:   lastVersion,
		ErrorDetail:   &status.Status{Code: 3, Message: msg},
	}, names)
}

func (s *Stream) currentNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names
}

func (s *Stream) send(req *discoveryv3.DiscoveryRequest, names []string) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	s.names = names
	s.mu.Unlock()
	return s.stream.Send(req)
}

// Close ends the stream and waits for its reader to stop.
func (s *Stream) Close() {
	s.cancel()
	<-s.done
}

// Decode reads a FetchSecrets or StreamSecrets response made by another
// client.
func Decode(resp *discoveryv3.DiscoveryResponse) (*Response, error) { return decode(resp) }

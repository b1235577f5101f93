package main

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// defaultSecret is the SDS resource name of the workload certificate.
const defaultSecret = "default"

// benchNode is the node the SDS and ADS clients present, shaped like an
// Envoy sidecar's.
var benchNode = &corev3.Node{Id: "sidecar~127.0.0.1~meshbench.bench~bench.svc.cluster.local", Cluster: "meshbench.bench"}

// dialUnix returns a gRPC client for the Unix socket at path. Its dialer
// tries to connect every millisecond until the socket accepts or gRPC's
// connect deadline passes, so a socket that appears late is used at once
// rather than after gRPC's reconnect backoff.
func dialUnix(path string, maxMsg int) (*grpc.ClientConn, error) {
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		for {
			c, err := d.DialContext(ctx, "unix", path)
			if err == nil {
				return c, nil
			}
			t := time.NewTimer(time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("connecting to %s: %w (last error: %v)", path, ctx.Err(), err)
			case <-t.C:
			}
		}
	}
	conn, err := grpc.NewClient("passthrough:///"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.WaitForReady(true)),
	)
	if err != nil {
		return nil, fmt.Errorf("creating client for %s: %w", path, err)
	}
	return conn, nil
}

// secretRequest asks for the given SDS resources; ACKs carry the version and
// nonce of the response they acknowledge.
func secretRequest(names []string, ack *discovery.DiscoveryResponse) *discovery.DiscoveryRequest {
	req := &discovery.DiscoveryRequest{Node: benchNode, TypeUrl: resource.SecretType, ResourceNames: names}
	if ack != nil {
		req.VersionInfo, req.ResponseNonce = ack.GetVersionInfo(), ack.GetNonce()
	}
	return req
}

// certKey identifies the certificate chain of the named TLS secret in an SDS
// response: an FNV-1a hash of its inline bytes. It fails when the response
// does not hold that secret with an inline certificate chain.
func certKey(resp *discovery.DiscoveryResponse, name string) (uint64, error) {
	b, err := proto.Marshal(resp)
	if err != nil {
		return 0, err
	}
	r, err := scanSDSResponse(b, name)
	return r.key, err
}

// firstSecret opens a StreamSecrets stream for "default" on conn and waits
// for the first response carrying it. It returns the time that response
// arrived.
func firstSecret(ctx context.Context, conn *grpc.ClientConn) (time.Time, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("opening SDS stream: %w", err)
	}
	if err := stream.Send(secretRequest([]string{defaultSecret}, nil)); err != nil {
		return time.Time{}, fmt.Errorf("sending SDS request: %w", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		return time.Time{}, fmt.Errorf("receiving SDS response: %w", err)
	}
	at := time.Now()
	if _, err := certKey(resp, defaultSecret); err != nil {
		return time.Time{}, err
	}
	return at, nil
}

// certArrivals records when one certificate reached the streams of a
// streamSet.
type certArrivals struct {
	// Key identifies the certificate chain (see certKey).
	Key uint64
	// First and Last are the earliest and latest arrival on any stream.
	First, Last time.Time
	// N counts the streams it has reached.
	N int
}

// streamSet holds many StreamSecrets streams for "default" over a few
// connections, as many Envoy listeners would. Every stream ACKs each
// response at once and records when each certificate reached it. The
// streams read and write messages in wire form (see sdswire.go).
type streamSet struct {
	total  int
	conns  []*grpc.ClientConn
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	certs   []*certArrivals // in order of first arrival
	byKey   map[uint64]*certArrivals
	err     error         // first stream failure
	changed chan struct{} // closed and replaced on every change
}

// openStreams dials conns connections to the SDS socket at path and opens
// perConn streams on each. The streams carry no deadline (no grpc-timeout,
// which would cost the agent a timer per stream): Envoy's SDS streams have
// none. They end with ctx all the same.
func openStreams(ctx context.Context, path string, conns, perConn int) (*streamSet, error) {
	streamsCtx, cancelStreams := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancelStreams)
	cancel := func() { stop(); cancelStreams() }
	ctx = streamsCtx
	s := &streamSet{total: conns * perConn, cancel: cancel, byKey: map[uint64]*certArrivals{}, changed: make(chan struct{})}
	for c := range conns {
		conn, err := dialUnix(path, 4<<20)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.conns = append(s.conns, conn)
		for i := range perConn {
			stream, err := conn.NewStream(ctx, &secretv3.SecretDiscoveryService_ServiceDesc.Streams[1],
				secretv3.SecretDiscoveryService_StreamSecrets_FullMethodName, grpc.ForceCodecV2(wireCodec{}))
			if err != nil {
				s.Close()
				return nil, fmt.Errorf("opening SDS stream %d: %w", c*perConn+i+1, err)
			}
			s.wg.Add(1)
			go s.run(stream)
		}
	}
	return s, nil
}

// run serves one stream until it ends.
func (s *streamSet) run(stream grpc.ClientStream) {
	defer s.wg.Done()
	req := &wireMessage{data: appendSDSRequest(nil, defaultSecret, "", "")}
	if err := stream.SendMsg(req); err != nil {
		s.fail(fmt.Errorf("sending SDS request: %w", err))
		return
	}
	var last uint64
	var resp wireMessage
	for {
		if err := stream.RecvMsg(&resp); err != nil {
			s.fail(fmt.Errorf("receiving SDS response: %w", err))
			return
		}
		at := time.Now()
		r, err := scanSDSResponse(resp.data, defaultSecret)
		if err != nil {
			s.fail(err)
			return
		}
		req.data = appendSDSRequest(req.data[:0], defaultSecret, r.version, r.nonce)
		if err := stream.SendMsg(req); err != nil {
			s.fail(fmt.Errorf("sending SDS ACK: %w", err))
			return
		}
		if r.key != last {
			s.arrived(r.key, at)
			last = r.key
		}
	}
}

func (s *streamSet) arrived(key uint64, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.byKey[key]
	if c == nil {
		c = &certArrivals{Key: key, First: at, Last: at}
		s.byKey[key] = c
		s.certs = append(s.certs, c)
	}
	if at.Before(c.First) {
		c.First = at
	}
	if at.After(c.Last) {
		c.Last = at
	}
	c.N++
	s.notifyLocked()
}

func (s *streamSet) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	s.notifyLocked()
}

func (s *streamSet) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// waitComplete waits until the i-th certificate (0 is the first) has reached
// every stream, and returns its arrivals.
func (s *streamSet) waitComplete(ctx context.Context, i int) (certArrivals, error) {
	for {
		s.mu.Lock()
		if i < len(s.certs) && s.certs[i].N >= s.total {
			c := *s.certs[i]
			s.mu.Unlock()
			return c, nil
		}
		err, changed := s.err, s.changed
		var got int
		if i < len(s.certs) {
			got = s.certs[i].N
		}
		s.mu.Unlock()
		if err != nil {
			return certArrivals{}, err
		}
		select {
		case <-ctx.Done():
			return certArrivals{}, fmt.Errorf("certificate %d on %d of %d streams: %w", i, got, s.total, ctx.Err())
		case <-changed:
		}
	}
}

// Close ends every stream and connection and waits for the stream
// goroutines. It is safe to call twice.
func (s *streamSet) Close() {
	s.cancel()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.conns = nil
	s.wg.Wait()
}

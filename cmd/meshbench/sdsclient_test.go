package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

// sdsServer is go-control-plane's SDS server on a Unix socket, answering
// from a snapshot cache, as a stand-in for the agent's SDS server.
type sdsServer struct {
	cache cache.SnapshotCache
	grpc  *grpc.Server
	done  chan struct{}
}

func startSDS(t *testing.T, path string) *sdsServer {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &sdsServer{cache: cache.NewSnapshotCache(false, cache.IDHash{}, nil), grpc: grpc.NewServer(), done: make(chan struct{})}
	secretv3.RegisterSecretDiscoveryServiceServer(s.grpc, serverv3.NewServer(ctx, s.cache, nil))
	go func() {
		defer close(s.done)
		_ = s.grpc.Serve(lis)
	}()
	t.Cleanup(func() {
		s.stop()
		cancel()
	})
	return s
}

func (s *sdsServer) stop() {
	s.grpc.Stop()
	<-s.done
}

// publish issues a fresh workload certificate and serves it as "default".
func (s *sdsServer) publish(t *testing.T, ca *localca.CA, version string) {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.Issue(localca.Leaf{PublicKey: key.Public(), Identity: pki.SPIFFEIdentity("cluster.local", "bench", "meshbench"), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	secret := &tlsv3.Secret{Name: defaultSecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: pki.EncodeCertificates(chain)}},
	}}}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.SecretType: {secret}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), benchNode.GetId(), snap); err != nil {
		t.Fatal(err)
	}
}

func newCA(t *testing.T) *localca.CA {
	t.Helper()
	ca, err := localca.New(localca.Config{Name: "meshbench test root", Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestFirstSecretWaitsForTheSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "socket")
	conn, err := dialUnix(path, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ca := newCA(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		at, err := firstSecret(ctx, conn)
		got <- result{at, err}
	}()
	// The client is trying to connect while there is no socket yet.
	for s := conn.GetState(); s == connectivity.Idle; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatal("the client never tried to connect")
		}
	}
	select {
	case r := <-got:
		t.Fatalf("firstSecret returned before there was a server: %v", r.err)
	default:
	}
	serverUp := time.Now()
	startSDS(t, path).publish(t, ca, "1")
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.at.Before(serverUp) {
		t.Errorf("first secret at %v, before the server started at %v", r.at, serverUp)
	}
}

func TestFirstSecretGivesUp(t *testing.T) {
	conn, err := dialUnix(filepath.Join(t.TempDir(), "socket"), 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := firstSecret(ctx, conn); err == nil {
		t.Fatal("no error without a server")
	}
}

func TestStreamSetFanout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "socket")
	s := startSDS(t, path)
	ca := newCA(t)
	s.publish(t, ca, "1")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	set, err := openStreams(ctx, path, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	first, err := set.waitComplete(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if first.N != 12 || first.Last.Before(first.First) {
		t.Errorf("first certificate: %+v", first)
	}

	// Nothing new yet: waiting for the next certificate times out.
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = set.waitComplete(short, 1)
	cancelShort()
	if err == nil || !strings.Contains(err.Error(), "on 0 of 12 streams") {
		t.Errorf("waiting for a certificate never published: %v", err)
	}

	before := time.Now()
	s.publish(t, ca, "2")
	second, err := set.waitComplete(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if second.Key == first.Key || second.N != 12 || second.First.Before(before) || second.Last.Before(second.First) {
		t.Errorf("second certificate %+v after first %+v", second, first)
	}

	// The server going away fails waiters instead of leaving them hanging.
	s.stop()
	if _, err := set.waitComplete(ctx, 2); err == nil || ctx.Err() != nil {
		t.Errorf("after the server stopped: %v (ctx %v)", err, ctx.Err())
	}
	set.Close()
	set.Close()
}

func TestCertKey(t *testing.T) {
	mk := func(s *tlsv3.Secret) *discovery.DiscoveryResponse {
		a, err := anypb.New(s)
		if err != nil {
			t.Fatal(err)
		}
		return &discovery.DiscoveryResponse{TypeUrl: resource.SecretType, Resources: []*anypb.Any{a}}
	}
	chain := func(b string) *tlsv3.Secret {
		return &tlsv3.Secret{Name: defaultSecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: []byte(b)}},
		}}}
	}
	k1, err := certKey(mk(chain("a")), defaultSecret)
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := certKey(mk(chain("b")), defaultSecret)
	k3, _ := certKey(mk(chain("a")), defaultSecret)
	if k1 == k2 || k1 != k3 {
		t.Errorf("keys a=%x b=%x a=%x", k1, k2, k3)
	}
	bad := map[string]*discovery.DiscoveryResponse{
		"wrong type":   {TypeUrl: resource.ClusterType},
		"no resources": {TypeUrl: resource.SecretType},
		"other name":   mk(&tlsv3.Secret{Name: "ROOTCA"}),
		"no chain":     mk(&tlsv3.Secret{Name: defaultSecret}),
		"not a secret": {TypeUrl: resource.SecretType, Resources: []*anypb.Any{{TypeUrl: resource.ClusterType, Value: []byte{0xff}}}},
	}
	for name, resp := range bad {
		if _, err := certKey(resp, defaultSecret); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

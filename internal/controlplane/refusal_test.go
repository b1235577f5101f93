package controlplane

import (
	"context"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/xdsserver"
)

// queueFetcher hands out tokens in order: Invalidate of the current one
// moves to the next, as a fetcher that asks for a new token would.
type queueFetcher struct {
	mu          sync.Mutex
	toks        []string
	invalidated []string
}

func (f *queueFetcher) Token(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.toks[0], nil
}

func (f *queueFetcher) Invalidate(tok string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.invalidated = append(f.invalidated, tok)
	if tok == f.toks[0] && len(f.toks) > 1 {
		f.toks = f.toks[1:]
	}
}

func (f *queueFetcher) refused() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.invalidated...)
}

func TestUnaryRefusalIsReportedToTheFetcher(t *testing.T) {
	ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{"fresh": testSA}})
	f := &queueFetcher{toks: []string{"stale", "fresh"}}
	conn, err := Dial(Config{Addr: ca.Addr(), ServerName: ca.ServerName(), Roots: StaticRoots{Pool: ca.Roots()}, Token: f})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, ca.Identity(testSA))
	if err != nil {
		t.Fatal(err)
	}
	req := &pb.IstioCertificateRequest{Csr: string(pki.EncodeCSRPEM(csr))}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := pb.NewIstioCertificateServiceClient(conn)

	if _, err := client.CreateCertificate(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("first call: %v, want Unauthenticated", err)
	}
	if got := f.refused(); len(got) != 1 || got[0] != "stale" {
		t.Fatalf("refused tokens %v, want [stale]", got)
	}
	if _, err := client.CreateCertificate(ctx, req); err != nil {
		t.Fatalf("second call, with the new token: %v", err)
	}
	if got := f.refused(); len(got) != 1 {
		t.Errorf("a success was reported as a refusal: %v", got)
	}
}

func TestUnaryFailureOtherThanUnauthenticatedIsNotARefusal(t *testing.T) {
	ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{"fresh": testSA}})
	ca.FailNext(1, codes.PermissionDenied)
	f := &queueFetcher{toks: []string{"fresh"}}
	conn, err := Dial(Config{Addr: ca.Addr(), ServerName: ca.ServerName(), Roots: StaticRoots{Pool: ca.Roots()}, Token: f})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: "x"})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("call: %v", err)
	}
	if got := f.refused(); len(got) != 0 {
		t.Errorf("refused tokens %v, want none", got)
	}
}

func TestStreamRefusalIsReportedToTheFetcher(t *testing.T) {
	ca, err := localca.New(localca.Config{Name: "xds root"})
	if err != nil {
		t.Fatal(err)
	}
	cp := xdsserver.Start(t, xdsserver.Config{CA: ca, Tokens: []string{"fresh"}})
	f := &queueFetcher{toks: []string{"stale", "fresh"}}
	conn, err := Dial(Config{Addr: cp.Addr(), ServerName: "localhost", Roots: StaticRoots{Pool: ca.Pool()}, Token: f})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)

	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("first stream: %v, want Unauthenticated", err)
	}
	if got := f.refused(); len(got) != 1 || got[0] != "stale" {
		t.Fatalf("refused tokens %v, want [stale]", got)
	}
	s, err = ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"}); err != nil {
		t.Fatal(err)
	}
	if !cp.WaitStreams(10*time.Second, func(c xdsserver.Counts) bool { return c.Active == 1 }) {
		t.Fatalf("the stream with the new token was not accepted: %+v", cp.Streams())
	}
	if got := f.refused(); len(got) != 1 {
		t.Errorf("refused tokens %v", got)
	}
}

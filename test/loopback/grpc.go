package loopback

import (
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// GRPC is a gRPC server on a loopback address that can be stopped and
// served again on the same address, as the test CAs are.
type GRPC struct {
	name  string
	addr  string
	build func() *grpc.Server

	mu   sync.Mutex
	srv  *grpc.Server
	done chan struct{} // closed when the current Serve returns
}

// ServeGRPC serves lis with a server from build, which makes a new
// *grpc.Server with its services registered each time the server starts.
// name prefixes Restart's failures.
func ServeGRPC(name string, lis net.Listener, build func() *grpc.Server) *GRPC {
	g := &GRPC{name: name, addr: lis.Addr().String(), build: build}
	g.serve(lis)
	return g
}

func (g *GRPC) serve(lis net.Listener) {
	srv := g.build()
	done := make(chan struct{})
	g.mu.Lock()
	g.srv, g.done = srv, done
	g.mu.Unlock()
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
}

// Addr is the host:port served; it stays the same across Restart.
func (g *GRPC) Addr() string { return g.addr }

// Stop closes the listener and every connection; new connections are
// refused until Restart. It is safe to call more than once.
func (g *GRPC) Stop() {
	g.mu.Lock()
	srv, done := g.srv, g.done
	g.srv, g.done = nil, nil
	g.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Stop()
	<-done
}

// Restart listens again on the same address, with a new server from build.
// A running server is stopped first.
func (g *GRPC) Restart(t testing.TB) {
	t.Helper()
	g.Stop()
	lis, err := ListenAgain(g.addr, 5*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", g.name, err)
	}
	g.serve(lis)
}

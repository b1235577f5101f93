package udslisten

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Serve serves a real gRPC server on the socket until its context ends,
// then stops it, removes the socket and returns nil; a Serve that fails
// (the listener closed under it) is returned as its error, the server
// stopped.
func TestServe(t *testing.T) {
	t.Run("until the context ends", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "socket")
		lis, err := Listen(Config{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		healthpb.RegisterHealthServer(gs, health.NewServer())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- lis.Serve(ctx, gs) }()

		cc, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		if _, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
			t.Fatalf("a call on the served socket: %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Serve returned %v after its context ended, want nil", err)
		}
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the socket is still there after Serve returned: %v", err)
		}
		if _, err := net.Dial("unix", path); err == nil {
			t.Fatal("the socket still answers after Serve returned")
		}
	})
	t.Run("until serving fails", func(t *testing.T) {
		path := filepath.Join(shortDir(t), "socket")
		lis, err := Listen(Config{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		stopped := make(chan struct{})
		srv := stopSignal{Server: grpc.NewServer(), stopped: stopped}
		done := make(chan error, 1)
		go func() { done <- lis.Serve(context.Background(), srv) }()
		_ = lis.Close() // Accept fails: gRPC's Serve returns its error
		if err := <-done; err == nil {
			t.Fatal("Serve returned nil when serving failed")
		}
		select {
		case <-stopped:
		default:
			t.Fatal("the server was not stopped")
		}
	})
}

// stopSignal is a gRPC server that says when it was stopped.
type stopSignal struct {
	*grpc.Server
	stopped chan struct{}
}

func (s stopSignal) Stop() {
	s.Server.Stop()
	close(s.stopped)
}

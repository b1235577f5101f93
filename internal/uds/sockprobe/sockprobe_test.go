package sockprobe

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// staleSocket leaves a socket file nobody listens on.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	_ = l.Close()
}

// listening makes a socket a process listens on but never serves.
func listening(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
}

// grpcServing makes a socket a gRPC server serves.
func grpcServing(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(l)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
}

func TestProbeAndRemoveStale(t *testing.T) {
	// A socket that accepts but never speaks gRPC gets this long to answer.
	const timeout = 200 * time.Millisecond
	tests := []struct {
		name       string
		make       func(t *testing.T, path string)
		answer     Answer
		state      State
		removed    bool
		err        error // of RemoveStale
		stillThere bool
	}{
		{"absent", func(*testing.T, string) {}, Connect, Absent, false, nil, false},
		{"stale", staleSocket, Connect, Stale, true, nil, false},
		{"stale for gRPC too", staleSocket, GRPC, Stale, true, nil, false},
		{"listening", listening, Connect, Alive, false, ErrInUse, true},
		{"listening, no gRPC", listening, GRPC, Stale, true, nil, false},
		{"gRPC server", grpcServing, GRPC, Alive, false, ErrInUse, true},
		{"regular file", func(t *testing.T, p string) {
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, Connect, NotSocket, false, ErrNotSocket, true},
		{"directory", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}, Connect, NotSocket, false, ErrNotSocket, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s")
			tt.make(t, path)
			state, err := Probe(context.Background(), path, timeout, tt.answer)
			if state != tt.state {
				t.Fatalf("Probe = %v (%v), want %v", state, err, tt.state)
			}
			if (state == Stale || state == NotSocket) != (err != nil) {
				t.Errorf("Probe error %v for state %v", err, state)
			}
			removed, err := RemoveStale(context.Background(), path, timeout, tt.answer)
			if removed != tt.removed || !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Errorf("RemoveStale = %v, %v; want %v, %v", removed, err, tt.removed, tt.err)
			}
			if _, err := os.Lstat(path); (err == nil) != tt.stillThere {
				t.Errorf("after RemoveStale the path exists: %v, want %v", err == nil, tt.stillThere)
			}
		})
	}
}

func TestProbeHonoursTheCallersContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	listening(t, path)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if state, err := Probe(ctx, path, time.Hour, GRPC); state != Stale || !errors.Is(err, context.Canceled) {
		t.Fatalf("Probe with a cancelled context = %v, %v; want Stale and context.Canceled", state, err)
	}
}

// TestGRPCStaleAtOnce: a socket nobody listens on is stale for the gRPC
// probe as soon as the connection is refused, not when the timeout ends.
func TestGRPCStaleAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	staleSocket(t, path)
	state, err := Probe(context.Background(), path, time.Minute, GRPC)
	if state != Stale || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Probe = %v, %v; want Stale with ECONNREFUSED (not the timeout)", state, err)
	}
}

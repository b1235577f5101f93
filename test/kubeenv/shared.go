package kubeenv

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/test/heavy"
)

// Shared is a test package's one API server: started by the first test that
// asks for it (fuzz workers and tests that need none never start one),
// shared by the package's tests, each in a namespace of its own, and stopped
// by Main. Declare one per package:
//
//	var kube = &kubeenv.Shared{}
//
//	func TestMain(m *testing.M) { os.Exit(kube.Main(m)) }
type Shared struct {
	// Options start the server.
	Options Options

	once    sync.Once
	env     *Env
	err     error
	mu      sync.Mutex
	onStops []func() error
}

// OnStop registers f to run after the package's tests and before the API
// server stops, latest first: how a server of the tests' own that uses the
// API server (istiod) stops while it is still there. An error fails the
// package.
func (s *Shared) OnStop(f func() error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onStops = append(s.onStops, f)
}

// Env returns the package's API server, starting it on first use; a server
// that cannot start fails t. Under -short, t is skipped instead.
func (s *Shared) Env(t testing.TB) *Env {
	t.Helper()
	heavy.Skip(t, "starts etcd and kube-apiserver")
	s.once.Do(func() { s.env, s.err = Start(context.Background(), s.Options) })
	if s.err != nil {
		t.Fatalf("starting the test API server: %v", s.err)
	}
	return s.env
}

// Main runs the package's tests, stops the API server if one was started,
// and then checks that no goroutine was left behind. It returns the exit
// code for os.Exit: a failed stop or a leaked goroutine fails the package.
func (s *Shared) Main(m *testing.M) int {
	code := m.Run()
	s.mu.Lock()
	stops := s.onStops
	s.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		if err := stops[i](); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	// Every test has returned: no Env call can race with this read.
	if s.env != nil {
		if err := s.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left:", err)
			code = 1
		}
	}
	return code
}

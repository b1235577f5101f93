package podresolver

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/test/kubeenv"
)

var (
	kubeOnce sync.Once
	kube     *kubeenv.Env
	kubeErr  error
)

// kubeEnv returns the package's API server, started on first use (fuzz
// workers and tests that need none never start it).
func kubeEnv(t *testing.T) *kubeenv.Env {
	t.Helper()
	kubeOnce.Do(func() { kube, kubeErr = kubeenv.Start(context.Background(), kubeenv.Options{}) })
	if kubeErr != nil {
		t.Fatalf("starting the test API server: %v", kubeErr)
	}
	return kube
}

// childConnectEnv makes the test binary a child that connects to the Unix
// socket it names and holds the connection until its stdin closes.
const childConnectEnv = "PODRESOLVER_TEST_CONNECT"

func TestMain(m *testing.M) {
	if path := os.Getenv(childConnectEnv); path != "" {
		conn, err := net.Dial("unix", path)
		if err != nil {
			os.Exit(2)
		}
		_, _ = io.Copy(io.Discard, os.Stdin)
		conn.Close()
		os.Exit(0)
	}
	code := m.Run()
	if kube != nil {
		if err := kube.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

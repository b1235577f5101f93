package podindex

import (
	"context"
	"fmt"
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
	kubeOnce.Do(func() {
		// Without a watch termination grace period the API server waits for
		// open watches (the index's) to end before it exits, and Restart
		// gives up after 15 s.
		kube, kubeErr = kubeenv.Start(context.Background(), kubeenv.Options{
			APIServerFlags: []string{"--shutdown-watch-termination-grace-period=2s"},
		})
	})
	if kubeErr != nil {
		t.Fatalf("starting the test API server: %v", kubeErr)
	}
	return kube
}

func TestMain(m *testing.M) {
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

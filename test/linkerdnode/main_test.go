// Package linkerdnode holds the end-to-end tests of the agent binary in node
// mode with CA_PROVIDER=Linkerd: the pods of the node come from a real
// Kubernetes API server, callers run in real pod cgroups, and the test
// identity service authenticates each CSR's token by TokenReview against the
// same API server, as Linkerd's does.
package linkerdnode

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/test/kubeenv"
)

// The API server is started by the first test that needs it and shared by
// the package's tests, each in a namespace of its own.
var (
	kubeOnce sync.Once
	kube     *kubeenv.Env
	kubeErr  error
)

func kubeEnv(t *testing.T) *kubeenv.Env {
	t.Helper()
	kubeOnce.Do(func() { kube, kubeErr = kubeenv.Start(context.Background(), kubeenv.Options{}) })
	if kubeErr != nil {
		t.Fatalf("starting the test API server: %v", kubeErr)
	}
	return kube
}

func TestMain(m *testing.M) {
	if sock := os.Getenv(childFetchEnv); sock != "" {
		os.Exit(childFetch(sock))
	}
	code := m.Run()
	if kube != nil {
		if err := kube.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left:", err)
			code = 1
		}
	}
	os.Exit(code)
}

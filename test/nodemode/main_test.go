package nodemode

import (
	"context"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/test/kubeenv"
)

// kube is the package's API server.
var kube *kubeenv.Env

func TestMain(m *testing.M) {
	if sock := os.Getenv(childEnv); sock != "" {
		os.Exit(runChild(sock))
	}
	var err error
	kube, err = kubeenv.Start(context.Background(), kubeenv.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the test API server (run make tools):", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := kube.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
		code = 1
	}
	removeChildBinary()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

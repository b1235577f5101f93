package podindex

import (
	"os"
	"testing"

	"github.com/meshagent/meshagent/test/kubeenv"
)

// kube is the package's API server, started by the first test that needs it.
var kube = &kubeenv.Shared{}

func kubeEnv(t *testing.T) *kubeenv.Env {
	t.Helper()
	return kube.Env(t)
}

func TestMain(m *testing.M) {
	os.Exit(kube.Main(m))
}

package trust

import (
	"os"
	"testing"

	"github.com/meshagent/meshagent/test/kubeenv"
)

// kube is the package's API server, started by the first test that needs
// it; Main checks for leaked goroutines.
var kube = &kubeenv.Shared{}

func TestMain(m *testing.M) { os.Exit(kube.Main(m)) }

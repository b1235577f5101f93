// Package linkerdnode holds the end-to-end tests of the agent binary in node
// mode with CA_PROVIDER=Linkerd: the pods of the node come from a real
// Kubernetes API server, callers run in real pod cgroups, and the test
// identity service authenticates each CSR's token by TokenReview against the
// same API server, as Linkerd's does.
package linkerdnode

import (
	"os"
	"testing"

	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/podproc"
)

// kube is the package's API server, started by the first test that needs it.
var kube = &kubeenv.Shared{}

func TestMain(m *testing.M) {
	podproc.RunFetchChild()
	os.Exit(kube.Main(m))
}

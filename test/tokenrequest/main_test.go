// Package tokenrequest holds the end-to-end tests of the agent binary getting
// its tokens from a real Kubernetes API server (CREDENTIAL_FETCHER_TYPE=
// TokenRequest) and a certificate from a test CA that authenticates it by
// TokenReview against the same server.
package tokenrequest

import (
	"os"
	"testing"

	"github.com/meshagent/meshagent/test/kubeenv"
)

// kube is the package's API server, started by the first test that needs it.
var kube = &kubeenv.Shared{}

func TestMain(m *testing.M) {
	os.Exit(kube.Main(m))
}

package podresolver

import (
	"io"
	"net"
	"os"
	"testing"

	"github.com/meshagent/meshagent/test/kubeenv"
)

// kube is the package's API server, started by the first test that needs it.
var kube = &kubeenv.Shared{}

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
	os.Exit(kube.Main(m))
}

// Package trustroots tests trust root rotation end to end: the agent binary
// follows a ConfigMap key and a signer's ClusterTrustBundles on a real API
// server, and istiod's ProxyConfig from a real xDS control plane, merged
// with its root file, while clients handshake through the rotation.
package trustroots

import (
	"os"
	"testing"

	"github.com/meshagent/meshagent/test/kubeenv"
)

var kube = &kubeenv.Shared{}

func TestMain(m *testing.M) { os.Exit(kube.Main(m)) }

//go:build linux

package podresolver

import (
	"testing"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/test/kubeenv"
)

// agentClient is the agent's Kubernetes client, as the API server's admin.
func agentClient(t *testing.T, kube *kubeenv.Env) *kubeclient.Client {
	t.Helper()
	client, err := kubeclient.NewForConfig(kube.Config())
	if err != nil {
		t.Fatal(err)
	}
	return client
}

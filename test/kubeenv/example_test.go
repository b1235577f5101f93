package kubeenv_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/meshagent/meshagent/test/kubeenv"
)

// A test package starts one Env in TestMain (see the package documentation); a test
// makes the objects it needs in a namespace of its own and gives the program under
// test a kubeconfig. (Compiled, not run: it would start etcd and
// kube-apiserver under go test -short too; TestPodBoundTokenReview and
// TestKubeconfigForServiceAccount run the same steps.)
func Example() {
	ctx := context.Background()
	env, err := kubeenv.Start(ctx, kubeenv.Options{})
	if err != nil {
		panic(err) // in TestMain: print it and exit 1; it says "run make tools" when the tools are missing
	}
	defer env.Stop()

	if _, err := env.CreateNamespace(ctx, "shop"); err != nil {
		panic(err)
	}
	if _, err := env.CreateServiceAccount(ctx, "shop", "cart"); err != nil {
		panic(err)
	}
	pod, err := env.CreatePod(ctx, "shop", "cart-0", "cart", "node-a")
	if err != nil {
		panic(err)
	}
	// What a kubelet would project into the pod: a token for the CA, bound to the pod.
	caToken, err := env.Token(ctx, "shop", "cart", []string{"istio-ca"}, pod, 10*time.Minute)
	if err != nil {
		panic(err)
	}
	// The agent under test talks to the API server as the pod's service account: a
	// token with no audience given is one for the API server itself.
	apiToken, err := env.Token(ctx, "shop", "cart", nil, pod, 0)
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "kubeenv-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	if err := env.Kubeconfig(filepath.Join(dir, "kubeconfig"), apiToken); err != nil {
		panic(err)
	}
	fmt.Println(pod.Spec.NodeName, pod.Spec.ServiceAccountName, pod.Status.Phase == corev1.PodPending, caToken != "")
}

// Command kubelet is the Kubernetes node agent built from its Go module at the version
// pinned in this module's go.mod, for the end-to-end tests' single-node cluster
// (test/e2e/cluster). scripts/tools.sh builds it with the version string set at link time.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}

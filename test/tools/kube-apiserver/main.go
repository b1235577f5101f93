// Command kube-apiserver is the Kubernetes API server built from its Go module at the
// version pinned in this module's go.mod, for the tests' own API server (test/kubeenv).
// scripts/tools.sh builds it with the version string set at link time.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}

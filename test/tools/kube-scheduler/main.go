// Command kube-scheduler is built from its Go module at the version pinned in this
// module's go.mod, for the end-to-end tests' single-node cluster (test/e2e/cluster).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}

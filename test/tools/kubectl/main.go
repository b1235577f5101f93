// Command kubectl is built from its Go module at the version pinned in this module's
// go.mod, for the end-to-end tests' single-node cluster (test/e2e/cluster).
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}

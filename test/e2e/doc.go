// Package e2e holds the end-to-end tests against a real single-node cluster
// (test/e2e/cluster): the chart installed with helm, the agent image of `make image`,
// pods scheduled by a real kubelet. They need root, the tools of
// `scripts/tools.sh -node` and containerd; they are built only with the e2e build tag
// (`make e2e`), so `go test ./...` skips them.
package e2e

// Package deploy holds what a user installs meshagent with in Kubernetes: the Helm
// chart in helm/meshagent (the sidecar Deployment and the node DaemonSet, their
// service accounts and RBAC). The package has no code of its own; its tests render the
// chart with the helm binary built by `make tools`, lint it, and have a real API
// server (test/kubeenv) validate every rendered object by server-side dry run and
// answer for the RBAC it grants, install and upgrade it with helm, and have the built
// agent accept the environment each rendered container gets (`meshagent config`).
package deploy

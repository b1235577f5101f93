// Package nodemode holds the end-to-end tests of node mode (one agent per
// node serving every pod's identity over one socket): the built agent
// binary (test/agentproc), a real API server (test/kubeenv), the test Istio
// CA authenticating the agent by TokenReview of its own pod-bound token and
// applying istiod's node authorizer (test/istioca), and callers that are
// real processes placed in pod cgroups (test/podproc).
//
// The package has no code of its own besides its tests. Its TestMain starts
// one API server for all tests; each test makes its own namespaces and node
// name, so tests never see each other's pods.
package nodemode

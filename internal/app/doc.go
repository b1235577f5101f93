// Package app is the agent's wiring: from the resolved settings it builds
// every component the configuration calls for and runs them.
//
// New(Config) checks the configuration (node mode's settings first, then
// the certificate source and each component's own checks) and builds the
// components without starting any: no goroutine, socket, connection or file
// write happens before Run, so a ConfigError always comes before a side
// effect. Run runs the components in an errgroup until its context ends, a
// loopback caller POSTs /quitquitquit, or one fails; the first failure
// stops the others and is returned with the component's name.
//
// The components, by file:
//   - source.go: where certificates come from (SelectSource: another agent's
//     socket, --dev, the workload credentials, the file-mounted
//     certificates, or a CA) and the removal of a stale socket;
//   - manager.go: the secret manager of each source and what feeds it (the
//     dev CA, the CA client and its root file, the watched credential files);
//   - caclient.go: the CA client of CA_PROVIDER and the bearer tokens;
//   - serving.go: the local socket (SDS and the SPIFFE Workload API) and,
//     beside one workload, the xDS proxy, OUTPUT_CERTS and the gRPC bootstrap;
//   - node.go, nodemetrics.go: node mode (the pod index, the caller
//     resolver, Linkerd's per-account tokens, the per-identity metrics).
//
// Seams (Config): the clock every timer and expiry uses, the logger, the
// metrics registry, the Kubernetes client, the status server's address.
// cmd/agent parses flags and the environment, makes the logger and handles
// signals; tests run the same wiring on a fake clock.
//
// An App is built and run by one goroutine; its fields are set by New and
// only read afterwards, except what the components own.
package app

// Package app is the agent's wiring: from the resolved settings it builds
// every component the configuration calls for and runs them.
//
// New(Config) builds the components without starting any: no goroutine,
// socket, connection or file write happens before Run, so a ConfigError
// always comes before a side effect. What the settings alone rule out,
// internal/settings refused when it resolved them. New decides where
// certificates come from (SelectSource), refuses what that decision rules
// out, then builds each part from what the parts before it returned, passed
// as arguments:
//
//  1. the Kubernetes client and the bearer token source, each made by the
//     first part that asks for it;
//  2. in node mode, the pod index (podIndex);
//  3. the certificate source: the secret manager and what feeds it, the CA
//     client among them (certificateSource);
//  4. the local socket and, beside one workload, the xDS proxy,
//     OUTPUT_CERTS and the gRPC bootstrap (servingComponents);
//  5. in node mode, the Pod Certificates signer (podCertificates).
//
// The pod index calls parts built after it (the manager, the socket, the
// Broker API) as pods come and go, through podHooks: each of their builders
// sets its hook once, before New returns. Of what the builders return, the
// App keeps what Run needs: the components, the CA preconnection and the
// socket to listen on.
//
// Run starts the CA connection, removes a stale socket, listens on the
// socket, then runs the components in an errgroup until its context ends, a loopback caller POSTs /quitquitquit, or one fails; the
// first failure stops the others and is returned with the component's name.
//
// The parts, by file:
//   - source.go: where certificates come from (SelectSource: another agent's
//     socket, --dev, the workload credentials, the file-mounted
//     certificates, or a CA) and the removal of a stale socket;
//   - manager.go: the secret manager of each source and what feeds it (the
//     dev CA, the CA client and its root file, the watched credential files);
//   - caclient.go: the CA client of CA_PROVIDER and the bearer tokens;
//   - serving.go: the local socket (SDS and the SPIFFE Workload API) and,
//     beside one workload, the xDS proxy, OUTPUT_CERTS and the gRPC bootstrap;
//   - node.go, nodemetrics.go: node mode (the pod index and its hooks, the
//     caller resolver, the Broker API, Linkerd's per-account tokens, the
//     per-identity metrics).
//
// Seams (Config): the clock every timer and expiry uses, the logger, the
// metrics registry, the Kubernetes client, the status server's address.
// cmd/agent parses flags and the environment, makes the logger and handles
// signals; tests run the same wiring on a fake clock.
//
// An App is built and run by one goroutine; its fields are set by New and
// only read afterwards, except what the components own.
package app

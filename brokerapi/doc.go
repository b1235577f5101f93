// Package brokerapi serves the SPIFFE Broker API (spiffe.broker.API, the
// generated types of package brokerpb) on a Unix socket of its own, in node
// mode: a broker (a node-level proxy or tunnel that acts for the workloads
// of its node) names a workload by a reference and gets that workload's
// X.509-SVIDs and bundles, from the same identity-keyed cache as SDS and
// the Workload API (docs/broker-api.md).
//
// It owns the endpoint: the socket (through udslisten, re-bound when taken),
// the mutual TLS (the agent presents its own X.509-SVID, read from the
// cache at each handshake; the broker's certificate is verified as an
// X.509-SVID against the trust bundle the cache holds at that handshake, so
// a root change needs no restart), the security header broker.spiffe.io:
// true on every call, the allow-list of brokers by SPIFFE ID with the
// reference types each may use (Config.Brokers), the resolution of
// references to a pod of the node, the per-broker limits, and the
// streams. It does not own who a process is (a Processes, the node
// socket's resolver: pidfd, cgroup, pod, PID-reuse guard), the node's pods
// (a Pods, the pod index), nor the certificates (a SecretSource, asked for
// "default" and "ROOTCA" with the workload's identity passed in, as sds and
// workloadapi do, so a broker shares the one cache and CSR budget).
//
// Refusals carry the codes of the SPIFFE Broker Endpoint and Broker API
// standards, with a google.rpc.ErrorInfo (domain spiffe.io) for the
// reference errors: no security header, InvalidArgument; a peer that is
// not an allowed broker, or a reference type not allowed for it,
// PermissionDenied; a reference that is malformed or of a type the agent
// does not serve, InvalidArgument (WORKLOAD_REFERENCE_INVALID); a process
// or pod that is not on this node, a pod whose UID is not the one given,
// NotFound (WORKLOAD_NOT_FOUND); a finished pod, a process outside the
// pods, an identity that is not a SPIFFE ID, PermissionDenied
// (WORKLOAD_NOT_ENTITLED). Each is counted by reason in
// meshagent_broker_refused_total and logged at a bounded rate (a line a
// second after a burst, with the count left out). The JWT methods answer
// Unimplemented: the mesh CAs issue no JWT-SVIDs.
//
// A stream ends, as the standard's workload lifecycle asks, when its pod
// leaves the node or finishes (PodLeft, called by the pod index), and for a
// pid reference when the process exits: the process is pinned by a pidfd
// before it is resolved (the resolver checks it read that process's
// /proc files, so a reused pid is never another pod's), and the pidfd,
// readable once the process exits, is waited on by the runtime's poller.
//
// Limits: Config.MaxStreams streams and Config.MaxWorkloads distinct pods
// per broker, refused with ResourceExhausted naming the setting. A broker
// that stops reading holds only its own streams: each stream's handler
// blocks in Send behind gRPC's flow-control window, and the changes it
// misses merge into one (the cache's one-slot watch channels), so what a
// stream holds is one response whatever the broker does.
//
// Concurrency: one goroutine per stream (gRPC's handler). Server.mu guards
// the per-broker counts and the streams by pod; it is never held while
// calling out. New starts nothing; Run serves until its context ends.
package brokerapi

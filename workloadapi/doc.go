// Package workloadapi serves the X.509 half of the SPIFFE Workload API
// (go-spiffe's generated SpiffeWorkloadAPI) as a service on the agent's
// local socket (Register, on udsserver).
//
// FetchX509SVID streams the caller's X.509-SVID and FetchX509Bundles the
// bundle of its trust domain, again each time a version changes. The JWT
// and WIT methods answer Unimplemented. A call without the metadata
// workload.spiffe.io: true, exactly once, is refused with InvalidArgument,
// as SPIRE does. Failures carry the Workload Endpoint standard's codes: a
// caller with no identity, or one that is not a SPIFFE ID (a Linkerd DNS
// name), gets PermissionDenied; a source that cannot answer now,
// Unavailable. Streams are bounded in all and per caller (Config), counted
// with SDS's when Config.Callers is shared.
//
// It owns neither the certificates nor who the caller is: it reads the
// identity udsserver put on the RPC's context once per call and passes it
// to its SecretSource.
//
// Concurrency: one goroutine per stream (gRPC's handler), which watches
// its names before reading them and then waits on the source's one-slot
// channels, so it sends only the newest versions and a client that stops
// reading blocks only its own stream. New starts nothing.
package workloadapi

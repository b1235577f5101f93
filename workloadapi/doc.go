// Package workloadapi serves the SPIFFE Workload API (SpiffeWorkloadAPI,
// go-spiffe's generated types) beside SDS, registered with Register on the
// agent's local socket server (package udsserver).
//
// It owns the X.509 half of the API: FetchX509SVID streams the caller's
// X.509-SVID (SPIFFE ID, DER certificate chain leaf first, PKCS#8 DER key,
// DER bundle of its trust domain) and FetchX509Bundles the bundle keyed by
// the trust domain's SPIFFE ID (the trust domain of the caller's identity,
// so it too waits for the caller's certificate); both send again when the
// certificate or the bundle is replaced, and only when a version changed. The JWT and WIT
// methods answer Unimplemented saying that only X.509-SVIDs are served.
// Every call must carry the gRPC metadata workload.spiffe.io: true exactly
// once; otherwise it is refused with InvalidArgument, as SPIRE does.
//
// It does not own the secrets nor who the caller is: it reads the identity
// of the caller that udsserver put on the RPC's context (caller.FromContext)
// once per call and asks a SecretSource (Secret and Watch) for "default" and
// "ROOTCA" with it explicitly (zero: the agent's own, in a sidecar; the
// caller's pod's identity in node mode). A certificate whose identity is
// not a SPIFFE ID (CA_PROVIDER=Linkerd issues DNS names, and its CA signs
// only the DNS SAN that was asked for) cannot be an X.509-SVID. Failures
// carry the codes of the SPIFFE Workload Endpoint standard: a caller that
// is not entitled to an SVID (no identity for it, or one that is not a
// SPIFFE ID) gets PermissionDenied saying why; a source that cannot serve
// now gets Unavailable; a missing security header InvalidArgument. Clients
// (go-spiffe) stop on InvalidArgument and retry the others with backoff.
//
// Limits: at most Config.MaxStreams streams at once, and at most
// Config.MaxStreamsPerCaller from one resolved caller (a pod in node mode),
// counted with its SDS streams when Config.Callers is shared with the SDS
// server, so one pod cannot take every stream from the others on its node; a stream
// over either limit is refused with ResourceExhausted naming it and counted
// in meshagent_workloadapi_refused_total. A sidecar's callers are all its one
// workload and share MaxStreams. Message size, the uid allow-list and
// caller resolution are udsserver's.
//
// Concurrency: one goroutine per stream, gRPC's handler, which watches the
// names before it reads them, sends, and then waits in a plain select on
// the source's one-slot watch channels. Signals merge, so a stream's queue
// of changes is one deep and it sends only the newest versions; a client
// that stops reading blocks only its own handler in Send. The Server holds
// the stream counts under one mutex, never held while calling out; New
// starts nothing.
package workloadapi

// Package xdsproxy is the agent's ADS proxy (docs/architecture.md): Envoy, or a proxyless
// gRPC client, talks to a local Unix socket, and the proxy carries each of its
// streams to the control plane over an authenticated connection, hiding the
// control plane's restarts from it.
//
// What it owns: the downstream gRPC server on the socket (both
// StreamAggregatedResources and DeltaAggregatedResources), one connection to
// the control plane shared by every stream, one upstream stream at a time per
// downstream stream, the reconnect loop with capped, jittered exponential
// backoff, the record of each client's subscriptions that lets a
// new upstream stream pick up where the old one stopped, the readiness signal
// (the first upstream answer) and the proxy's metrics.
//
// What it does not own: trust roots, the bearer token, the client certificate
// and extra metadata all come in through controlplane.Config and are
// consulted afresh at every connection (TLS handshake; the token and
// metadata at every stream). It never decodes or re-encodes
// resources: responses are moved as the raw bytes gRPC received (a pass-
// through codec over mem.BufferSlice; the proxy's own subscriptions below
// are the exception), and only a few top-level fields (type
// URL, nonce, and for delta each resource's name and version) are read from
// the wire. Requests, which are small, are decoded to follow subscriptions and
// are forwarded as received, except in the one case described next.
//
// The upstream connection: Run dials it before serving and connects at once,
// so a client's first stream does not wait for a TLS handshake, and closes it
// after the last stream. Streams on it are independent: gRPC replenishes the
// connection's flow-control window as it reads, so a client that stops
// reading stalls only its own upstream stream. When the connection drops,
// gRPC connects again on the next stream; a retry after the proxy's backoff
// also cuts gRPC's own reconnect wait short, so the proxy's clock decides
// when an attempt happens.
//
// Reconnects: when an upstream stream fails, the downstream stream stays open.
// After the backoff the proxy opens a new upstream stream and first sends,
// per type URL in the order the client first asked: for SotW, the client's
// current resource names and its last applied version_info, no nonce, the
// node on the first; for delta, the subscribed names (with "*" when
// wildcard) and initial_resource_versions holding the versions the client has
// ACKed. A client ACK or NACK that answers a response of a lost upstream
// stream is not forwarded (the new stream never sent it); if such a request
// also changes the subscription, it is forwarded with the nonce of the
// newest response of the current stream instead, since control planes ignore
// requests with unknown nonces.
//
// The proxy's own subscriptions (Config.Subscriptions: istiod's ProxyConfig
// for the mesh's roots): on every upstream stream, after the client's first
// request (which names the node), the proxy subscribes to each such type
// itself, wildcard, with what it last accepted (SotW: the version; delta:
// initial_resource_versions). Responses of these types are decoded, handed
// to the Subscription's Apply, ACKed or NACKed by the proxy and never
// forwarded; every other response takes the raw path above unchanged. With
// no subscriptions configured the path is exactly as before.
//
// Concurrency: New starts nothing. Run serves until its context ends, and
// gRPC's server waits for every stream handler, which waits for its
// goroutines, before Run returns. Each downstream stream has a reader
// (requests, queued for upstream) and an upstream loop (responses,
// forwarded downstream); each upstream stream also has a sender draining
// its request queue, so a control plane that stops reading requests while
// pushing a large response cannot stall responses (a queue past
// MaxMessageSize replaces the stream). A per-stream mutex guards the
// subscription record and the current upstream stream; nothing waits on the
// network while holding it. Ready and the metrics are safe to use from any
// goroutine.
package xdsproxy

// Package sds serves Envoy's Secret Discovery Service (StreamSecrets and
// FetchSecrets, go-control-plane types), registered with Register on the
// agent's local socket server (package udsserver, which owns the socket, the
// peer credentials, the uid allow-list, the caller in each RPC's context and
// the largest message accepted).
//
// It owns the xDS stream rules and the conversion of held secrets into
// Envoy resources: a certificate becomes a TlsCertificate (chain and PKCS#8
// key as inline bytes), a trust bundle a ValidationContext (trusted CA as
// inline bytes).
// It does not own the secrets: it asks a SecretSource (two methods, Secret
// and Watch, given the RPC's context, which carries the caller), which
// decides what each name means (default is the caller's identity, ROOTCA,
// file-cert:..., file-root:...). DeltaSecrets is not implemented, as in
// pilot-agent and SPIRE.
//
// Requests are read from the wire by wireRequest (request.go), which skips
// the node and keeps the fields the rules below need.
//
// Stream rules (docs/architecture.md): a request whose resource names differ (as a set)
// from the stream's current ones is answered with every named secret
// available, even when it carries error_detail (a NACK that changes the
// names is a subscription change); an ACK (our latest nonce, same names, no
// error_detail) gets no reply; a NACK (error_detail set, same names) gets no
// reply and is logged and counted; a request whose nonce is not our latest
// is stale and ignored; a name that can never be served (unknown, or no
// identity for the caller) ends the stream with InvalidArgument naming it,
// as does a request for another type or for more than MaxNames names.
// VersionInfo is a timestamp and a counter; the nonce is random.
//
// Every name on a stream resolves on its own (docs/architecture.md): the stream reads its
// names with SecretSource.Current, which never waits. A name not available now (no certificate yet, CA down, expired, a
// file not readable yet) is left out of the response, logged and counted in
// meshagent_sds_resources_unavailable_total, and pushed as soon as its
// source signals it; the other names, ROOTCA above all, are served and
// pushed meanwhile. Responses are not deletions: a name left out keeps what
// the client already holds. FetchSecrets waits (bounded by its context) for
// every name and fails naming the first one not available.
//
// Empty resource_names: the stream is served Config.DefaultNames ("default"
// and "ROOTCA"), the two secrets this agent always holds, like SPIRE's
// "everything" without exposing provider-backed names nobody asked for.
//
// Limits and peers: at most Config.MaxStreams streams are served at once, and
// at most Config.MaxStreamsPerCaller from one resolved caller (its pod, else
// its identity; a caller the socket server did not resolve, a sidecar's, is
// bounded by MaxStreams only); one more is refused with ResourceExhausted
// naming the limit, counted in meshagent_sds_refused_total and logged. The RPC context carries the
// caller (caller.FromContext); sds reads its identity once per stream or
// fetch and asks the SecretSource with it explicitly.
// File resources (file-cert:, file-root:) are held by the source while a
// stream watches them, from a table of bounded size: so that no caller can
// starve the others (MESHAGENT_SDS_MAX_FILE_RESOURCES_PER_CALLER in
// docs/configuration.md), the streams of one caller (its pod when
// resolved, else its identity, else its connecting uid and pid) hold at
// most Config.MaxFileNamesPerCaller of them at once, counted here, where
// the caller and its streams are known; one more ends the stream with
// ResourceExhausted naming it and the limit, counted in
// meshagent_sds_refused_total{reason="max_file_names_per_caller"}. A name
// whose watch the source refused (a nil channel: unknown, a bad file, the
// table full) ends the stream with InvalidArgument naming it, even if a
// later Secret would serve it, so no name is served unwatched.
//
// Concurrency: a waiting stream holds one goroutine, its gRPC handler,
// blocked reading the next request. Streams of callers with the same
// identity share one watch per name on the source (Server.watchMu guards
// the shared watches); the watch's goroutine, on each signal, kicks every
// member stream without blocking. A kicked stream pushes on a goroutine of
// its own that ends once the stream is up to date; the answer to a request
// is sent the same way. stream.mu serialises a stream's state and its
// Sends between the handler and that goroutine. Signals merge: after a
// change the stream sends the newest versions only, and only if they
// differ from what it last sent. A slow or stuck client blocks only its
// own push goroutine (in Send, once gRPC's flow-control windows are full),
// never the watch, the publisher or other streams; when it reads again it
// gets what was already queued in gRPC and then the newest versions,
// skipping those it missed. A push that fails ends the stream when its
// next request or its end arrives.
//
// Each secret is encoded once per name into its Envoy resource and the
// encoding is shared, read-only, by every response carrying it (a cache
// keyed weakly by the secret, so an entry goes with its secret); each
// response still has its own version and nonce. New starts nothing.
package sds

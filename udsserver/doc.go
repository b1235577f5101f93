// Package udsserver is the agent's local gRPC server on a Unix socket, on
// which SDS and the SPIFFE Workload API are served side by side.
//
// It owns the socket (directory created 0750, socket 0666 as pilot-agent; a
// stale socket file is removed before listening, a live one is left alone and
// Run fails with ErrSocketInUse; a regular file is never removed; the socket
// is removed when Run returns), the grpc.Server and what applies to every
// RPC before a service sees it: the largest message accepted
// (Config.MaxRecvBytes, ResourceExhausted beyond), the uid allow-list
// (Config.AllowedUIDs) and the caller (Config.Resolver). It does not own the
// services: each registers itself through Config.Services and keeps its own
// limits and metrics.
//
// Callers: the transport credentials add no security (the socket is local)
// but read each new connection's SO_PEERCRED (uid, gid, pid; Linux only)
// once, log it, and keep it with the connection. Interceptors put the
// caller in every RPC's context (caller.NewContext): without a Resolver,
// caller.Info with the credentials only (the agent's own identity is
// meant); with one, what it answers, asked on the connection's first RPC
// and kept for the connection's life, so a process is resolved once however
// many RPCs it makes (and the pid it is resolved from is the one that
// connected). A refusal is not kept: the next RPC on the connection asks
// again, since a pod may be unknown for a moment after its process starts.
// A refused caller gets PermissionDenied naming the reason and is counted in
// meshagent_socket_refused_total.
//
// Encoding: messages are protobuf, except that a service may Send a
// WireMessage, a message already in wire form as pieces, which the socket's
// codec sends without marshalling or copying (SDS sends each secret's
// encoding, shared by every stream, this way).
//
// Concurrency: New starts nothing; Run starts gRPC's serving goroutines and
// stops them before it returns. A connection's resolution is guarded by a
// one-slot semaphore of that connection, so concurrent first RPCs on one
// connection ask the Resolver once and a waiting RPC gives up with its
// context; connections never wait on each other.
package udsserver

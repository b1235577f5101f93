// Package udsserver is the agent's local gRPC server on a Unix socket, on
// which SDS and the SPIFFE Workload API are served side by side.
//
// It owns the socket (directory created 0750, or Config.DirMode, 0755 in
// node mode so that pods' processes of any uid reach the socket; socket 0666
// as pilot-agent; a
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
// and a pidfd of the connecting process (peerpidfd.FromConn) once, log
// them, and keep them with the connection; the pidfd is passed to the
// Resolver (peerpidfd.NewContext), so a pid reused between connect() and
// the first RPC is seen, and is closed when the connection closes (or when
// the last resolution using it returns, whichever is later). A connection
// whose process could not be pinned at accept (it had exited) is refused
// when a Resolver is set; kernels without pidfds (ENOSYS) resolve by pid. Interceptors put the
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
// Memory per connection (one per pod in node mode): gRPC's read buffer is a
// small one taken from a pool only when the socket is readable (the pinned
// connection reads through the raw socket, as gRPC does for a bare one), the
// write buffer is shared, and clients are asked to keep no header table.
//
// Encoding: messages are protobuf, except that a service may Send a
// WireMessage, a message already in wire form as buffers, which the socket's
// codec sends without marshalling or copying (SDS sends each secret's
// encoding, shared by every stream, this way), and a service may RecvMsg
// into a WireDecoder, which reads its own wire form (SDS reads requests and
// ACKs this way, skipping the node it never uses).
//
// Concurrency: New starts nothing; Run starts gRPC's serving goroutines and
// stops them before it returns. A connection's resolution is guarded by a
// one-slot semaphore of that connection, so concurrent first RPCs on one
// connection ask the Resolver once and a waiting RPC gives up with its
// context; connections never wait on each other.
package udsserver

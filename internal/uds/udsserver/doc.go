// Package udsserver is the agent's local gRPC server on a Unix socket, on
// which SDS and the SPIFFE Workload API are served side by side.
//
// It owns the socket, through udslisten (directories it creates are 0750,
// or Config.DirMode, 0755 in node mode so that pods' processes of any uid
// reach the socket; an existing directory is never changed; the socket is
// 0666 as pilot-agent's; a stale socket is replaced, a live one or a file
// makes Run fail unless Config.Replace, node mode, replaces it; a socket
// removed or replaced while Run runs is bound again within seconds, counted
// in meshagent_socket_rebound_total; only its own socket is removed when
// Run returns), the grpc.Server and what applies to every connection and
// RPC before a service sees it: the caller, the per-caller limits, the
// largest message accepted (Config.MaxRecvBytes, ResourceExhausted beyond)
// and the uid allow-list (Config.AllowedUIDs). It does not own the
// services: each registers itself through Config.Services and keeps its own
// limits and metrics.
//
// Callers: the transport credentials add no security (the socket is local)
// but identify each connection when it is accepted: SO_PEERCRED (uid, gid,
// pid; Linux only), a pidfd of the connecting process (peerpidfd.FromConn),
// and, with a Resolver, its pod, asked then with the pidfd in the context
// (so a pid reused since connect() is seen) and kept for the connection's
// life; the pidfd is closed as soon as the caller is resolved. At accept the
// Resolver is told not to wait (caller.NoWait). A caller the Resolver
// refuses for good at accept (its process may have exited: it can never be
// served) is refused at the handshake, with PermissionDenied naming the
// reason; one refused for now (caller.IsTemporary: its pod is not known
// yet) is asked again at each RPC and when CallerArrived names its pod,
// keeping its pidfd until then and counted against the pod its cgroup
// names (caller.PodOf) meanwhile, or its uid when none. Refusals are
// counted in meshagent_socket_refused_total and logged at a bounded rate
// (refuse.go: per pod, or per uid outside pods, the first of an interval,
// then one line with how many followed).
//
// Refusing at the handshake (refuse.go): a connection over its pod's share
// of the handshakes being identified or over them all
// (Config.MaxHandshakes), its caller's connections or its caller's
// connection rate (Config.MaxConnRatePerCaller), or whose caller is refused
// for good, gets no gRPC transport: the server answers its first call, when
// it comes at once, with the status naming the setting or the reason,
// writes a GOAWAY carrying the same text and closes it. Before its caller
// is known a connection counts against the pod its process's cgroup names
// (caller.Grouper), a group for processes that have exited, or its uid: a
// pod whose processes connect as a fresh uid each time is still one pod,
// for the handshakes it holds, the refusals waiting for their client's
// call and the log. Interceptors put the caller in every RPC's context
// (caller.NewContext): without a Resolver, caller.Info with the
// credentials only (the agent's own identity is meant).
//
// Limits per caller, a pod when the Resolver names one, else the uid of the
// connecting process: connections (Config.MaxConnsPerCaller; one more is
// refused at its handshake), streams per connection
// (Config.MaxStreamsPerConn, HTTP/2 MAX_CONCURRENT_STREAMS), unary calls
// served at once (Config.MaxUnaryPerCaller) and response bytes queued and
// not yet written to the caller's sockets (Config.MaxQueuedBytesPerCaller:
// a client that stops reading, or sets its HTTP/2 window to 0, has its
// further calls and stream messages refused; what is written counts as
// taken only as DATA payload, not as control frames). Each refusal is
// ResourceExhausted naming the setting. A connection without an RPC for
// Config.IdleTimeout is closed. Limits of one caller never hold another
// back: the counts are per caller, and a connection's resolution runs on
// its own goroutine.
//
// A pod that leaves (CallerLeft, from node mode's pod index) loses its
// connections: their streams end at once with PermissionDenied naming why,
// further RPCs are refused the same way, and the connections are closed
// shortly after.
//
// Memory per connection (one per pod in node mode): gRPC's read buffer is a
// small one taken from a pool only when the socket is readable (the
// connection reads through the raw socket, as gRPC does for a bare one),
// the write buffer is shared, clients are asked to keep no header table,
// and no pidfd is held once the caller is known. A connection is parked
// until its first request (park): the server answers the HTTP/2 handshake
// itself and hands the connection to gRPC, with what it read of the
// handshake, at the client's first frame after it. A parked connection
// holds one goroutine (4 KB of stack), its record and its socket, ~8 KB;
// gRPC's three goroutines and transport, ~14 KB more, come with its first
// request (TestIdleConnectionMemory). A parked connection is closed after
// Config.IdleTimeout and when Run returns.
//
// Encoding: messages are protobuf, except that a service may Send a
// WireMessage, a message already in wire form as buffers, which the socket's
// codec sends without marshalling or copying (SDS sends each secret's
// encoding, shared by every stream, this way), and a service may RecvMsg
// into a WireDecoder, which reads its own wire form (SDS reads requests and
// ACKs this way, skipping the node it never uses).
//
// Files by concern: identify.go (who the caller is), limits.go and
// refusals.go (the limits, and refusing and logging), h2.go and
// park_linux.go (the HTTP/2 written by hand: a refusal's answer, parking;
// pinned against grpc-go by TestHandWrittenHTTP2Conformance), conn.go (the
// socket as gRPC sees it), server.go (Config and Run, served by
// udslisten's Listener.Serve as the xDS proxy's socket is).
//
// Concurrency: New starts nothing; Run starts gRPC's serving goroutines and
// the socket's watch, and stops them before it returns. A connection's
// resolution is guarded by a one-slot semaphore (x/sync) of that connection, so
// concurrent RPCs on a connection still unresolved ask the Resolver once
// and a waiting RPC gives up with its context; connections never wait on
// each other.
package udsserver

// Package sockprobe tells a live Unix socket from a stale one left behind by
// a process that is gone, and removes the stale one.
//
// It owns only that check: the SDS server and the xDS proxy call RemoveStale
// before they listen, and the agent's start-up decision (is another agent
// already serving SDS?) calls Probe. What counts as an answer is the
// caller's choice: Connect (a process accepts connections) or GRPC (a gRPC
// server completes its handshake).
//
// It keeps no state and starts no goroutine that outlives a call.
package sockprobe

// Command meshsoak runs the meshagent binary for a bounded time (default 3
// minutes, at most 5) against a test CA (test/istioca) and a go-control-plane
// ADS server (test/xdsserver) on loopback while injecting faults, and checks
// that the agent keeps every workload served. It is what `make soak` runs:
//
//	go run ./cmd/meshsoak -agent bin/meshagent [-duration 2m] [-seed N] [-agent-uid N] [-pods-duration 1m]
//
// Faults, chosen at random: the CA is stopped and restarted, answers slowly
// (2 s), or answers badly (wrong SAN, expired) for a few seconds; the xDS
// upstream is stopped and restarted; the CA root file is rewritten with the
// same content, or with an extra root appended and later removed. Meanwhile
// 200 SDS clients connect, subscribe to "default" and "ROOTCA", ACK, and
// disconnect at random; some read slowly. One ADS client stays connected
// through the agent's xDS proxy so the upstream flaps are felt.
//
// Hostile SDS clients ask for file resources that are hard to serve: a
// file-root: in a directory the agent may read but not list (mode 0711,
// owned by root; when meshsoak runs as root the agent runs as nobody,
// -agent-uid, so the kernel really refuses the watch), a file-root: whose
// directory is deleted and made again every few seconds, and 200 distinct
// file-root: names asked for over time by clients that hold each briefly.
// The first two files are rewritten every few seconds; a client holding
// one must hold the new content once it has settled (a poll interval and
// the debounce, plus slack). Every one of the 200 names must be served.
//
// CA budget: the test CA logs every CSR with the identity it asks for; the
// most CSRs of one identity in any minute (sliding window) is reported and
// must stay within maxCSRsPerIdentityMinute.
//
// Invariants, checked every second: every SDS client connected for longer
// than a grace period holds an unexpired "default" whose private key matches
// its leaf; the agent process has not exited. At the end, with every client
// gone, the agent's goroutine count (from /debug/pprof/goroutine on the
// loopback status port) and open file descriptors (/proc/<pid>/fd) must come
// back to their baseline within a tolerance, and VmRSS must not grow beyond
// a tolerance. The figures are printed; the exit status is 1 when an
// invariant broke. Linux only.
//
// Hostile pods (-pods-duration, default 1 minute, 0 skips; needs root and
// the API server binaries of scripts/tools.sh, else it is reported skipped):
// after the soak above, a second agent runs in node mode against a real API
// server (test/kubeenv) and the test CA applying istiod's node authorizer,
// its pods' clients being meshsoak itself started again and moved into
// kubelet-shaped pod cgroups (test/podproc). Two good pods fetch their
// certificate over a new connection every 200 ms; one pod holds 2,000 idle
// connections; one sends 20,000 FetchSecrets on one connection whose HTTP/2
// window is 0 and reads nothing; the CA refuses one pod's identity
// (istioca.RefuseIdentity) while it asks again and again; one pod holding a
// stream is deleted halfway. Invariants: the agent's RSS stays under a
// bound (held by the per-caller limits on connections, streams and
// queued response bytes); every good fetch after the first certificate
// succeeds with its own identity within a latency bound; the refused
// identity is never served; no CSR of a good identity fails (one identity's
// refusal must not cancel another's CSR); the deleted pod's stream ends
// within a bound and its connection is refused afterwards (this needs a
// leaving pod's connections to be closed).
//
// meshsoak owns the agent processes it starts; it is started with a
// parent-death signal and stopped when the command returns.
package main

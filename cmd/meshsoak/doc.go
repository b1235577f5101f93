// Command meshsoak runs the meshagent binary for a bounded time (default 3
// minutes, at most 5) against a test CA (test/istioca) and a go-control-plane
// ADS server (test/xdsserver) on loopback while injecting faults, and checks
// that the agent keeps every workload served. It is what `make soak` runs:
//
//	go run ./cmd/meshsoak -agent bin/meshagent [-duration 2m] [-seed N] [-agent-uid N]
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
// meshsoak owns the one agent process it starts; it is started with a
// parent-death signal and stopped when the command returns.
package main

// Command meshbench measures the meshagent binary against a test CA
// (test/istioca) and a go-control-plane ADS server (test/xdsserver) on
// loopback, and prints one line per figure:
//
//	BENCH <name> <median> <unit> (min <x> max <y>, n=<runs>)
//
// It is what `make bench` runs, from the module root:
//
//	go run ./cmd/meshbench
//
// The figures and their targets are described in docs/performance.md. The
// agent binary (default bin/meshagent) is built from ./cmd/agent when it is
// missing, or always with -build.
//
// Each agent runs as its own process in a fresh working directory laid out as
// pilot-agent expects (token and CA root under ./var/run/secrets), with only
// the environment set here. Memory and CPU are read from /proc (VmRSS, VmHWM,
// per-thread schedstat, utime+stime), so the command runs on Linux only.
//
// The node group (-only node, -node-pods) runs the agent in node mode against
// a real API server (test/kubeenv, built by `make tools`) and the test CA's
// node authorizer, with one process per pod in that pod's cgroup: the
// podclient program (./podclient, built into the run's directory) connects
// to the agent's socket from the pod and hands the connection to meshbench,
// which runs the pod's SDS stream on it. Creating cgroups needs root.
//
// meshbench owns the agent processes it starts: every one is stopped when its
// measurement ends, all are killed when the command returns or is
// interrupted, and each is started with a parent-death signal so none
// outlives the command. Figures that cannot be measured print a FAIL line
// with the reason and make the exit status 1; the others are still measured.
package main

// Package podresolver decides, in node mode, which workload the process at
// the other end of the agent's socket is: it implements caller.Resolver.
//
// It owns the path from the kernel's credentials of a connection to an
// identity: SO_PEERCRED pid -> /proc/<pid>/cgroup (parsed by podcgroup) ->
// pod UID -> the pod, from the node's pod index (podindex) ->
// spiffe://<td>/ns/<ns>/sa/<sa>. It also owns the guard against PID reuse, the
// identities given to node processes by uid (Config.NodeUIDs), and the
// refusal reasons and their metrics. It does not
// accept connections or read SO_PEERCRED (the socket server does, and calls
// Resolve once per connection), watch pods, or hold certificates.
//
// # How node mode fits together
//
// A podindex.Index (in the agent's errgroup) watches the pods of the node
// and tells its handler which identities come and go, so their certificates
// are fetched ahead and dropped. A Resolver is built over that index
// (Config.Pods). The socket server takes the connecting process's pidfd
// with peerpidfd.FromConn when it accepts, before anything else, passes it
// in the context (peerpidfd.NewContext) to Resolve with the connection's
// SO_PEERCRED, and puts the caller.Info it gets back into every request's
// context (caller.NewContext): that is what the SDS and Workload API
// handlers see. An error from Resolve refuses the connection with
// PermissionDenied and the error's text.
//
// # Trust model
//
// Only what the kernel says is used: the pid, uid and gid the kernel recorded
// when the process called connect(), and the cgroup the kernel shows for that
// pid, whose path the kubelet and the container runtime chose. Nothing the
// caller sends (resource names, metadata, tokens) names the identity: in node
// mode "default" means the identity found here. A process in a container
// cannot change its cgroup (the cgroup file system is read-only there, and a
// pod that is privileged or shares the host's PID namespace and mounts can
// already read every secret on the node). The agent must run in the host's
// PID namespace: a pid from another namespace is 0 and refused.
//
// What is refused, and the reason label counted in
// meshagent_node_callers_refused_total: no pid (no_pid); a process that has
// exited, or exits during the lookup (process_gone); a pid reused during the
// lookup (pid_reused); /proc unreadable (proc_unreadable); a cgroup file
// naming two pods, a kubepods path of unknown shape, a kubepods tree outside
// the kubelet's cgroup root (Config.CgroupRoot: a delegated subtree whose
// owner named a cgroup after another pod), or a path relative to the
// agent's cgroup namespace (cgroup_invalid); a
// node process whose uid has no configured identity (node_process), or
// whose cgroup is a container runtime's outside the pods (container_runtime); a
// process of a static pod, whose cgroup names the kubelet's manifest hash
// and no pod of the API server (static_pod, at once rather than after
// Config.PodWait); a pod UID
// the node's pod list does not have after Config.PodWait (pod_unknown: a pod
// of another node, a pod already deleted, or a cgroup nobody's pod owns); a
// pod whose phase is Succeeded or Failed (pod_terminated); a request that
// gave up while its pod was awaited (canceled). A pod being
// deleted is still served: its containers run through their grace period
// and need their certificates to drain. Pending pods are served: the kubelet
// starts containers before it reports Running. A refusal's text speaks of
// the caller's own pid, uid and pod UID only, never of other pods.
//
// # PID reuse
//
// SO_PEERCRED gives the pid of the process that connected, as it was then.
// If that process exits, the pid may be given to a new process, possibly in
// another pod, while the connection lives on in a child that inherited the
// socket; reading /proc/<pid> would then describe the new process and hand
// its identity to the old connection. The guard:
//
//   - Before reading /proc/<pid>/cgroup, Resolve pins the process with a
//     pidfd: the connection's own when the context carries one
//     (peerpidfd.NewContext), else pidfd_open(pid). After reading, it checks
//     the pidfd's process has not exited: a live process keeps its pid, so
//     what was read was that process's. The connection's pidfd must name the
//     pid of SO_PEERCRED; once the connecting process has exited (fdinfo
//     "Pid: -1") the connection is refused, whoever holds its pid now.
//   - Where pidfds cannot be used (a test's /proc root), it reads the
//     process start time (field 22 of /proc/<pid>/task/<pid>/stat, the main
//     thread's: /proc/<pid>/stat sums every thread and costs O(threads))
//     before and after, and refuses when it changed. With a pidfd it reads
//     no start time: the pinned process alive after the read is the guard.
//
// Group (caller.Grouper) reads the cgroup file alone, unpinned, to tell
// the socket server which pod a connection counts against before it is
// resolved; it is never an identity.
//
// Limits: the pidfd must be taken when the connection is accepted
// (peerpidfd.FromConn). SO_PEERPIDFD (Linux 6.5) is taken by the kernel at
// connect() and leaves no window; on older kernels FromConn opens one by pid,
// and a pid reused between connect() and accept goes unseen: the attacker
// must exit and the kernel must hand the pid (after cycling through pid_max,
// 4,194,304 by default on 64-bit nodes) to a process of the victim pod, all
// before the agent accepts. Without a connection pidfd at all, Resolve opens
// one itself, and the window runs from connect() to Resolve, which a caller
// controls when resolution waits for its first request: a socket server that
// resolves late must pass the connection's pidfd. The start-time check alone
// misses two processes started within one clock tick (10 ms) on one pid.
//
// # What a compromised agent exposes
//
// The agent holds the private keys of every identity with a pod on its node
// and a token trusted to request certificates for them (Istio: a
// CA_TRUSTED_NODE_ACCOUNTS service account; the CA only issues for
// identities with a pod on the agent's node). A compromised agent therefore
// exposes the identities of its node's pods, no others: the same as a
// compromised kubelet or container runtime on that node.
//
// Concurrency: a Resolver holds no mutable state; Resolve may be called from
// any number of goroutines. New starts nothing.
package podresolver

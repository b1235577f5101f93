// Package memlimit finds the memory limit of the process's cgroup (cgroup
// v2's memory.max, v1's memory.limit_in_bytes; the smallest on the way up
// to the hierarchy's mount) and sets Go's soft memory limit to a share of
// it unless GOMEMLIMIT says otherwise, as pilot-agent does: the garbage
// collector then works harder as the container nears its limit instead of
// the kernel killing it (docs/operations.md).
//
// It reads /proc/self/cgroup and /proc/self/mountinfo (through
// github.com/moby/sys/mountinfo) under a root directory, "/" outside tests. It
// holds no state.
package memlimit

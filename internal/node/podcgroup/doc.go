// Package podcgroup reads which Kubernetes pod (and container) a process
// belongs to from the text of its /proc/<pid>/cgroup file.
//
// It owns the parsing only: Root.Parse takes the file's bytes and returns the
// pod UID and container ID that the kubelet and container runtime encoded in
// the cgroup path. It does not read /proc, guard against PID reuse or look
// pods up (package podresolver does), and it keeps no state.
//
// Shapes understood, on every line of the file (cgroup v1 has one line per
// hierarchy, cgroup v2 one line "0::<path>"):
//
//   - cgroupfs driver: /kubepods/<qos>/pod<uid>/<container-id>, with no
//     <qos> component for Guaranteed pods;
//   - systemd driver:
//     /kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice/<runtime>-<container-id>.scope,
//     where <uid> has its dashes written as underscores and <runtime> is
//     cri-containerd, crio or docker;
//   - either of them under a prefix, which the Root must name: a kubelet
//     cgroupRoot (/x/kubepods, kind's /kubelet.slice/kubelet-kubepods.slice)
//     or a node that is itself a container (/docker/<id>/kubepods).
//
// A pod UID is a UUID or the 32 hexadecimal digits of a static pod's hash.
// The container component is optional (a process placed in the pod's own
// cgroup has none); components below it are allowed and ignored. It is
// recognised by an allow-list: <runtime>-<id>.scope with runtime
// cri-containerd, crio or docker (systemd), <id> or crio-<id> (cgroupfs),
// the id being a CRI container ID (64 lower-case hexadecimal digits);
// anything else under a pod (CRI-O's conmon scope, another runtime's or a
// made-up name) is not a pod container and makes Parse fail.
//
// Trust: the path is written by the kubelet and the container runtime, and a
// process inside a container cannot change it (the cgroup file system is
// read-only there). But anyone given a delegated cgroup subtree can create
// cgroups of any name inside it: a node user (user.slice), a service with
// systemd's Delegate=, an nspawn or LXD container (machine.slice). Such a
// user could name a cgroup .../kubepods/besteffort/pod<victim>/<id> and
// pass for the victim. So a pod counts only under the kubelet's own root
// (Root: DefaultRoot, a setting, or learned from the agent's own pod by
// LearnRoot), at its exact place: a kubepods tree anywhere else makes Parse
// fail. A path relative to the reader's cgroup namespace (/../..) cannot be
// placed and makes Parse fail too: the agent must see the host's cgroup
// hierarchy (cgroup v1, or a container sharing the host's cgroup
// namespace). Lines that name no pod (other v1 hierarchies, "/") are
// ignored; lines that name two different pods, or a kubepods path that does
// not have the shape above, make Parse fail rather than guess.
package podcgroup

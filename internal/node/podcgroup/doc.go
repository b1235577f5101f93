// Package podcgroup reads which Kubernetes pod (and container) a process
// belongs to from the text of its /proc/<pid>/cgroup file.
//
// It owns the parsing only: Parse takes the file's bytes and returns the
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
//   - either of them under a prefix: a kubelet --cgroup-root (kind's
//     /kubelet.slice/kubelet-kubepods.slice/...), a node that is itself a
//     container (/docker/<id>/kubepods/...), or a path relative to the
//     reader's cgroup namespace (/../../kubepods...).
//
// A pod UID is a UUID or the 32 hexadecimal digits of a static pod's hash.
// The container component is optional (a process placed in the pod's own
// cgroup has none); components below it are allowed and ignored.
//
// Trust: the path is written by the kubelet and the container runtime, and a
// process inside a container cannot change it (the cgroup file system is
// read-only there). Parse therefore only accepts a kubepods tree that does not
// sit under user.slice, the one place where systemd delegates cgroup creation
// to unprivileged node users: such a user could otherwise name a cgroup after
// someone else's pod. A system service given cgroup delegation (systemd's
// Delegate=) can do the same in its own subtree: such services (container
// runtimes) are trusted like the kubelet. Lines that name no pod (other v1 hierarchies, "/") are
// ignored; lines that name two different pods, or a kubepods path that does
// not have the shape above, make Parse fail rather than guess.
package podcgroup

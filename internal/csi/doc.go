// Package csi is the node plugin of the CSI driver csi.meshagent.io: it hands the node
// agent's socket directory to pods as an ephemeral inline volume, bind-mounted read-only,
// so that client pods need no hostPath volume (which Pod Security "baseline" forbids and
// through which a root pod could replace the socket for the whole node).
//
// It owns three things: the CSI Identity and Node services (Driver), the kubelet's
// plugin-registration service that announces the driver (Registrar), and the mounts it
// makes. It keeps no state of its own: whether a pod's volume is published is read from
// the mount table (/proc/self/mountinfo) at every call, so a restart of the driver or of
// the kubelet never loses or doubles a mount. NodePublishVolume on a target that is
// already a mount point returns success without mounting again (the kubelet calls it
// again for every volume after it restarts); NodeUnpublishVolume on a target that is not
// mounted succeeds.
//
// The bind mounts must reach the host's mount namespace: the driver's container mounts
// the kubelet's pods directory with Bidirectional propagation, which needs a privileged
// container. The agent itself stays unprivileged (docs/kubernetes.md).
//
// Server runs both gRPC services until its context ends. Driver methods are safe for
// concurrent use: calls on one target path are serialised (a fixed set of locks chosen
// by the path's hash).
package csi

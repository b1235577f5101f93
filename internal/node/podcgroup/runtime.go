package podcgroup

import "strings"

// containerScopes are the cgroup path components by which container
// runtimes name a container they run outside the kubelet's pods: systemd
// scopes (docker-<id>.scope, libpod-<id>.scope of podman, rootless or not,
// crio-, cri-containerd- and nerdctl-), and cgroupfs directories (/docker/<id>,
// /lxc.payload.<name>, /libpod_parent).
var containerScopes = []string{"docker-", "libpod-", "libpod_parent", "crio-", "cri-containerd-", "nerdctl-", "lxc.payload", "machine-"}

// ContainerRuntime reports whether the content of /proc/<pid>/cgroup puts
// the process in a container that a runtime runs outside the kubelet's pods
// (docker run, podman run, nerdctl run, a systemd-nspawn machine), and names
// the cgroup component that says so. Such a process shares the node's uids
// but is not the node's: it gets no node identity.
func ContainerRuntime(data []byte) (string, bool) {
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.SplitN(line, ":", 3)
		if len(fields) != 3 {
			continue
		}
		parts := strings.Split(fields[2], "/")
		for i, c := range parts {
			if c == "docker" && i+1 < len(parts) && parts[i+1] != "" {
				return c, true // cgroupfs driver: /docker/<id>
			}
			for _, s := range containerScopes {
				if strings.HasPrefix(c, s) {
					return c, true
				}
			}
		}
	}
	return "", false
}

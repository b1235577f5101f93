// Package cluster starts and tears down a real single-node Kubernetes cluster for the
// end-to-end tests (test/e2e, `make e2e`): etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and a kubelet built from the Go modules
// pinned in test/tools (scripts/tools.sh -node), containerd and runc from the
// distribution, CNI bridge networking.
//
// Everything runs as root on the machine itself, but inside a network namespace the
// package makes (NetnsName): the node address and the kubernetes Service address sit
// on that namespace's loopback, pods sit on a CNI bridge in it, and nothing routes out.
// The test reaches the API server through Dial (a connection opened inside the
// namespace) and runs kubectl and helm through Command (nsenter). Processes share the
// machine's mount namespace, as a kubelet and its runtime must.
//
// The kubelet runs with cgroupRoot /meshagent-e2e: its pods live under
// /meshagent-e2e/kubepods/... in every cgroup hierarchy. A kubelet removes pod cgroups
// it did not make, killing their processes, but only under its own cgroup root (it
// scans its QoS cgroups, <root>/kubepods/{,besteffort,burstable}); other tests on the
// machine make fake pod cgroups under /kubepods and must not be touched.
//
// Stop tears down what Start made, whatever state it is in: pods and their sandboxes
// (through the CRI), the processes, every mount under the kubelet's and containerd's
// directories, the cgroups under /meshagent-e2e, the network namespace, the
// directories that did not exist before, and the sysctls the kubelet changes
// (restored to their values before Start). A Start that fails calls it too.
package cluster

// Package credfetcher says where bearer tokens come from. A Fetcher returns the
// token to present to the CA or the control plane; clients ask it on every
// request.
//
// File reads the token file each time, so a token the kubelet rotates on disk
// is always fresh; it keeps nothing. TokenRequest asks the Kubernetes API for a
// token of the workload's service account, bound to its pod, keeps it in
// memory only, and replaces it after a share of its life or when a peer
// refused it: clients report a refusal through Invalidator (see Refused).
// PodTokenFiles gives an agent that asks on behalf of other workloads
// (node mode with Linkerd) each service account's own token, the one the
// node's CSI driver was handed by the kubelet for a pod of the account on
// the node, read at every call; the agent creates no token.
//
// What it does not own: which peer a token may be sent to (caclient), how the
// Kubernetes client is configured (kubeclient).
//
// Fetchers are safe for concurrent use. File holds no state. TokenRequest
// guards its token, its request in flight and its retry state with one mutex,
// never held across a request; the request runs in a goroutine of its own
// that ends with it. PodTokenFiles holds no state.
package credfetcher

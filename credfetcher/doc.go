// Package credfetcher says where bearer tokens come from. A Fetcher returns the
// token to present to the CA or the control plane; clients ask it on every
// request.
//
// File reads the token file each time, so a token the kubelet rotates on disk
// is always fresh; it keeps nothing. TokenRequest asks the Kubernetes API for a
// token of the workload's service account, bound to its pod, keeps it in
// memory only, and replaces it after a share of its life or when a peer
// refused it: clients report a refusal through Invalidator (see Refused).
// PodTokens keeps one TokenRequest per service account for an agent that
// asks on behalf of other workloads (node mode with Linkerd): each bound to
// one of the account's pods that a PodLister names, rebound to another when
// that pod is no longer listed, dropped with the account's identity.
//
// What it does not own: which peer a token may be sent to (caclient), how the
// Kubernetes client is configured (kubeclient).
//
// Fetchers are safe for concurrent use. File holds no state. TokenRequest
// guards its token, its request in flight and its retry state with one mutex,
// never held across a request; the request runs in a goroutine of its own
// that ends with it. PodTokens guards its map with one mutex, not held while
// the PodLister is called.
package credfetcher

// Package credfetcher says where bearer tokens come from. A Fetcher returns the
// token to present to the CA or the control plane; it is asked again on every
// request, so a token that the kubelet rotates on disk is always fresh.
//
// Fetchers hold no goroutines and are safe for concurrent use.
package credfetcher

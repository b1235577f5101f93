// Package kubeclient builds the agent's Kubernetes client configuration: the
// files named by KUBECONFIG when set (as kubectl reads them), else the
// in-cluster configuration of the pod's service account.
//
// It owns only the configuration; what is asked of the API server belongs to
// the packages that ask (credfetcher for tokens). It holds no state.
package kubeclient

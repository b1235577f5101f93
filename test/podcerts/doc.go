// Package podcerts tests the built agent as a Kubernetes Pod Certificates
// signer (docs/pod-certificates.md): in node mode, with the chart's RBAC
// bound to its service account, against a real API server whose node
// restriction checks the requests made through each node's kubelet
// identity, and the test Istio CA with its node authorizer. Only tests live
// here.
package podcerts

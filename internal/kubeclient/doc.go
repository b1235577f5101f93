// Package kubeclient is the agent's Kubernetes API client: its
// configuration (the files named by KUBECONFIG when set, as kubectl reads
// them, else the in-cluster configuration of the pod's service account) and
// the few requests the agent makes: TokenRequest for a service account
// (CreateToken), list and watch of pods (ListPods, WatchPods, and
// PodListWatch for a client-go informer) and of a trust bundle's ConfigMap
// (ConfigMapListWatch), and, through Certificates, the requests to
// certificates.k8s.io/v1: a Pod Certificates signer's list, watch and
// status of PodCertificateRequests, and ClusterTrustBundles (written by the
// signer, followed by the trust bundle: ClusterTrustBundleListWatch).
//
// It links only the types it sends and receives: authentication/v1's
// TokenRequest, and Pod, ConfigMap, PodCertificateRequest and
// ClusterTrustBundle, the agent's own types decoded from the API server's
// JSON (k8s.io/api/certificates/v1 would also link core/v1's generated
// code). client-go's clientset (k8s.io/client-go/kubernetes) and its
// scheme link every API group's generated code, which every start of the
// agent pays for in size, init time and resident memory; the agent must not
// import them (a test in cmd/agent checks its dependency graph). Tests may.
//
// What is asked of the API server, and when, belongs to the packages that
// ask (credfetcher for tokens, the node's pod index for pods,
// internal/trust for bundles). A Client
// holds no state of its own beyond client-go's HTTP transport and is safe for
// concurrent use.
package kubeclient

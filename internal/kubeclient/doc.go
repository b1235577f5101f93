// Package kubeclient is the agent's Kubernetes API client: its
// configuration (the files named by KUBECONFIG when set, as kubectl reads
// them, else the in-cluster configuration of the pod's service account) and
// the few requests the agent makes: TokenRequest for a service account
// (CreateToken) and list and watch of pods (ListPods, WatchPods, and
// PodListWatch for a client-go informer), and, through Certificates, a Pod
// Certificates signer's requests to certificates.k8s.io/v1: list and watch
// of PodCertificateRequests, their status, and ClusterTrustBundles.
//
// It links only the types it sends and receives: authentication/v1's
// TokenRequest, and Pod, PodCertificateRequest and ClusterTrustBundle, the
// agent's own types decoded from the API server's JSON
// (k8s.io/api/certificates/v1 would also link core/v1's generated code). client-go's clientset (k8s.io/client-go/kubernetes) and its
// scheme link every API group's generated code, which every start of the
// agent pays for in size, init time and resident memory; the agent must not
// import them (a test in cmd/agent checks its dependency graph). Tests may.
//
// What is asked of the API server, and when, belongs to the packages that
// ask (credfetcher for tokens, the node's pod index for pods). A Client
// holds no state of its own beyond client-go's HTTP transport and is safe for
// concurrent use.
package kubeclient

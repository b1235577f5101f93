// Package podcert makes the node agent a Kubernetes Pod Certificates signer
// (certificates.k8s.io/v1 PodCertificateRequest): the kubelet asks for a
// certificate for a pod's podCertificate projected volume, and the agent of
// the pod's node answers with a mesh certificate of the pod's identity,
// spiffe://<trust domain>/ns/<namespace>/sa/<service account>, signed by the
// mesh CA. See docs/pod-certificates.md.
//
// It owns: an informer of the PodCertificateRequests with
// spec.nodeName=<node> (a field selector: other nodes' requests are never
// listed), filtered to its signer name; the checks of each request (no
// unverifiedUserAnnotations, an empty stub CSR, a key type mesh proxies
// accept, a pod of the node's pod index with the request's UID, name,
// namespace and service account); the CA request made with the stub CSR as
// is (it is signed by the pod's key, which never leaves the pod) for the
// pod's identity, through the agent's one signing pipeline
// (secretmanager.Manager.SignCSR: one CSR budget with the certificate
// cache, a per-identity backoff so a failing identity never delays
// another, and the checks of every CA answer); the check of the validity
// window the API server accepts (one hour to the request's
// maxExpirationSeconds, NotBefore within five minutes of now, the CA's
// backdating learnt from its answers and subtracted from the validity
// asked); the status written through the status subresource (Issued with
// the chain, notBefore, notAfter and beginRefreshAt; Denied or Failed with
// a reason). Apart from the Signer, the Publisher keeps the
// ClusterTrustBundle named BundleName(signer) equal to the mesh's roots; it
// runs once per cluster (`meshagent trust-publisher`), never in a node
// agent, whose RBAC for the signer is sign alone.
//
// It does not own: the CA protocol and impersonation (the CA given, e.g.
// the node agent's caclient/istio client, which names the pod's identity
// in ImpersonatedIdentity), the pod index (internal/node/podindex), the
// roots' source, or the API client (internal/kubeclient.Certificates). The
// kubelet owns the key, the files and the refresh.
//
// Concurrency: Run starts the informer and, once both the requests and the
// node's pods have been listed, Workers workers fed by one delaying work
// queue keyed by request; the queue never hands one request to two
// workers. Signer.mu guards the per-request attempt counts and the learnt
// backdating; it is never held across a CA or API request. New starts
// nothing; Run returns after every goroutine it started has ended.
package podcert

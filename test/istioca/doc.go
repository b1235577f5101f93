// Package istioca is an Istio-protocol certificate authority for tests: a real
// gRPC server over TLS on a loopback address that answers
// /istio.v1.auth.IstioCertificateService/CreateCertificate the way istiod and
// cert-manager's istio-csr do.
//
// It authenticates the caller by a bearer token looked up in Config.Tokens,
// by a TokenReview of the token against a Kubernetes API server (Config.Kube,
// audience istio-ca, identity from the service account
// system:serviceaccount:<ns>:<sa>, as istiod), or by a client certificate
// issued by its own CA whose URI SAN is a SPIFFE ID of its trust domain (the
// VM renewal flow). The identity always comes from the caller, never from the
// CSR; a CSR that asks for anything else is rejected with InvalidArgument, as
// istio-csr does.
//
// A request whose metadata names an ImpersonatedIdentity is served for that
// identity only as istiod's node authorizer allows it: the caller, reviewed
// by the API server, is in Config.TrustedNodeAccounts, its pod still exists
// with the UID its token is bound to, and a pod of the requested service
// account that has not failed runs on the caller pod's node. Anything else
// is Unauthenticated with an opaque message; Denials keeps the reason.
//
// Like istiod, the node authorizer answers from a pod informer: with
// Config.Kube, Start lists and watches every pod of the cluster (kept
// stripped to name, UID, node, service account and phase, and indexed by
// node and service account) and serves only once that first list is in, so
// a CSR costs the API server one TokenReview and no pod look-up. The cache
// lags the API server by a watch event. A pod deleted, or failed, is
// refused once the informer has seen it, and allowed until then, as by
// istiod. A pod created just before its first CSR may not be cached yet:
// istiod refuses then, and the node agent retries after its backoff until
// the informer has caught up. The test CA instead waits for its informer,
// up to Config.PodCacheWait, and if the pod is still missing asks the API
// server once (a Get of the caller's pod, a List of the namespace's pods on
// the node): it answers what the agent's retry would get, without the
// backoff, and a test that creates a pod and asks at once does not depend
// on the informer's timing. PodCacheMisses and PodReads count both.
//
// Tests steer it at run time: Stop and Restart on the same address, answer
// badly on purpose (SetMode), fail with a chosen code (SetError, FailNext;
// RefuseIdentity for one identity), answer slowly (SetDelay, or HoldNext
// until the test releases the call), or present an unexpected serving
// certificate (SetServingCert). It records what it received (Requests,
// LastMetadata, LastRequest, Tokens, Reviews, Denials) so a test can assert
// on the CA side.
//
// It owns no process-wide state. A Server is safe for concurrent use; all its
// mutable state sits behind one mutex (the pod informer's store has its
// own), and Start registers a cleanup that stops the server and the
// informer when the test ends.
package istioca

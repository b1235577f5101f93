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
// Tests steer it at run time: Stop and Restart on the same address, answer
// badly on purpose (SetMode), fail with a chosen code (SetError, FailNext),
// answer slowly (SetDelay), or present an unexpected serving certificate
// (SetServingCert). It records what it received (Requests, LastMetadata,
// LastRequest, Tokens, Reviews, Denials) so a test can assert on the CA side.
//
// It owns no process-wide state. A Server is safe for concurrent use; all its
// mutable state sits behind one mutex, and Start registers a cleanup that
// stops it when the test ends.
package istioca

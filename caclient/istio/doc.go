// Package istio is the client of the Istio CA protocol:
// /istio.v1.auth.IstioCertificateService/CreateCertificate, as served by
// istiod and cert-manager's istio-csr. It implements caclient.Client.
//
// It owns the request (the CSR in PEM, the validity in seconds, the CertSigner
// metadata, and in node mode the ImpersonatedIdentity metadata: when
// Config.Identity, the identity the agent's own token stands for, differs
// from the identity a Sign asks for, the request names the latter, as
// istiod's node authorizer expects from a trusted node account), the parsing of the answer and the request metrics. One Sign is
// one CreateCertificate call: it does not retry (pilot-agent does, a few tries
// inside one call, which stacks under any outer retry and multiplies the load
// on a struggling CA); the secret manager retries with its per-identity
// backoff. It does not own the transport rules (TLS verification,
// the bearer token, client certificates and extra metadata come from
// controlplane.Dial), where tokens come from (credfetcher), nor the judgement of
// the returned chain, which the caller makes with pki.VerifyIssued.
//
// A Client holds one gRPC connection at a time, made lazily on the first Sign
// and replaced after a failed call so that the next call starts a fresh
// handshake (new roots, a restarted CA, no reconnect backoff left over). The
// connection is guarded by a mutex; Sign is safe for concurrent use and Close
// is safe to call twice. The client starts no goroutines of its own.
//
// Neither the token nor any private key is ever logged: the client never sees
// the key, and the token stays inside the transport.
package istio

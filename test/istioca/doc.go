// Package istioca is an Istio-protocol certificate authority for tests: a real
// gRPC server over TLS on a loopback address that answers
// /istio.v1.auth.IstioCertificateService/CreateCertificate the way istiod and
// cert-manager's istio-csr do.
//
// It authenticates the caller by a bearer token looked up in Config.Tokens, or
// by a client certificate issued by its own CA whose URI SAN is a SPIFFE ID of
// its trust domain (the VM renewal flow). The identity always comes from the
// caller, never from the CSR; a CSR that asks for anything else is rejected
// with InvalidArgument, as istio-csr does.
//
// Tests steer it at run time: Stop and Restart on the same address, answer
// badly on purpose (SetMode), fail with a chosen code (SetError, FailNext),
// answer slowly (SetDelay), or present an unexpected serving certificate
// (SetServingCert). It records what it received (Requests, LastMetadata,
// LastRequest, Tokens) so a test can assert on the CA side.
//
// It owns no process-wide state. A Server is safe for concurrent use; all its
// mutable state sits behind one mutex, and Start registers a cleanup that
// stops it when the test ends.
package istioca

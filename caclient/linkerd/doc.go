// Package linkerd is the client of the Linkerd identity protocol:
// /io.linkerd.proxy.identity.Identity/Certify. It implements
// caclient.Client for CA_PROVIDER=Linkerd.
//
// It owns the request (the DNS-like identity, the token, the CSR in DER), the
// rule that the token, which travels in the request body rather than in gRPC
// metadata, is only placed in the body once the connection that will carry it
// has shown a TLS peer with the expected identity-service name (or is a
// plaintext connection to a loopback address), the parsing of the answer (DER leaf and intermediates, checked
// against valid_until) and the request
// metrics. It does not own the TLS verification itself (controlplane.Dial checks
// the peer against the trust anchors at every handshake), where tokens come
// from (credfetcher), retries and rotation (the secret manager), nor the
// judgement of the returned chain, which the caller makes with
// pki.VerifyIssued.
//
// The protocol carries no lifetime: Sign's ttl argument is ignored and the
// identity service decides (24 h by default in Linkerd).
//
// The token comes from one source (Config.Token) or, for an agent that
// certifies the identities of other workloads (node mode), from a source
// chosen per identity (Config.TokenFor): the identity service checks that the
// token's service account is the requested identity's.
//
// An answer that may mean the token was refused (Unauthenticated,
// FailedPrecondition, InvalidArgument) is reported to the token source
// (credfetcher.Refused), so a source that keeps tokens gets a new one.
//
// A Client holds at most one gRPC connection, made on the first Sign and
// dropped after a call that failed in the transport so that the next call
// starts with a fresh handshake (new roots, a restarted identity service); a
// status the identity service answered keeps it. The connection is
// guarded by a mutex; Sign is safe for concurrent use and Close is safe to call
// twice. The client starts no goroutines of its own beyond gRPC's. The token is
// never logged.
package linkerd

// Package linkerdca is a Linkerd-protocol identity service for tests: a real
// gRPC server over TLS on a loopback address that answers
// /io.linkerd.proxy.identity.Identity/Certify with Linkerd's validation rules
// and error codes:
//
//   - issuer not ready (SetReady(false)): Unavailable;
//   - a missing identity, token or CSR, or a CSR that does not parse or whose
//     signature does not check: InvalidArgument;
//   - a CSR without exactly one DNS SAN equal to the requested identity, with
//     a common name other than empty or the identity, or with IP, email or URI
//     SANs: FailedPrecondition;
//   - a token not in the token table: InvalidArgument (Linkerd's "invalid
//     token"); a token marked rejected (RejectToken): FailedPrecondition
//     (Linkerd's "not authenticated");
//   - a requested identity other than the token's: FailedPrecondition.
//
// With Config.TokenReviews, a token not in the table is authenticated as
// Linkerd's identity service does it, by a TokenReview against a (test) API
// server with audience identity.l5d.io: an error in the review's answer
// (a token of another audience, a bound pod that is gone) or a user that is
// not a service account is InvalidArgument, an unauthenticated token
// FailedPrecondition, and the token proves the identity of its service
// account. Each review is recorded with the account and the pod the token
// is bound to (Reviews).
//
// An accepted request gets a leaf valid from now minus 20 s (Linkerd's clock
// skew allowance) for the configured lifetime (24 h by default), signed by an
// intermediate issuer, answered as DER leaf plus DER intermediates (the trust
// anchor is not sent) with valid_until set to the leaf's NotAfter.
//
// Tests steer it at run time: Stop and Restart on the same address, answer
// badly on purpose (SetMode), answer slowly (SetDelay), change the lifetime
// (SetLifetime), or present an unexpected serving certificate
// (SetServingCert). It records every request it receives, including the
// token, so a test can assert what reached the identity service (Requests,
// Tokens).
//
// It owns no process-wide state. A Server is safe for concurrent use; its
// mutable state sits behind one mutex, and Start registers a cleanup that stops
// it when the test ends.
package linkerdca

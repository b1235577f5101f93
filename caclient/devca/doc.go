// Package devca is an in-process caclient.Client backed by a localca.CA, for
// `meshagent run --dev` (a laptop trial, not production) and for tests that
// need a CA without a network.
//
// It owns the CSR checks a mesh CA makes (signature, exactly one SAN equal to
// the requested identity, no stray names) and the issuing of the certificate.
// It does not own the root's distribution: callers take the root from CA().
// The client holds no goroutines; it is safe for concurrent use, and its only
// mutable state (closed flag, request count) is guarded by one mutex.
package devca

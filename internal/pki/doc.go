// Package pki holds the small X.509 helpers every other package shares: workload
// key generation, CSRs carrying a SPIFFE URI SAN or a DNS SAN, PEM and PKCS#8
// encoding, strict parsing of PEM bundles, and the checks a certificate must pass
// before the agent uses it (docs/architecture.md).
//
// It owns no state and starts no goroutines; every function is safe for
// concurrent use. Private keys never leave memory through this package except as
// bytes handed back to the caller.
package pki

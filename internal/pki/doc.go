// Package pki holds the workload identity and the small X.509 helpers every
// other package shares: the Identity value (a SPIFFE ID or a Linkerd DNS
// name) and the Scheme that names it for a namespace and service account and
// owns the rules that follow from the mesh (renewal policy, token audience,
// the CA's server name); workload key generation, CSRs carrying a SPIFFE URI
// SAN or a DNS SAN, PEM and PKCS#8 encoding, strict parsing of PEM bundles,
// and the checks a certificate must pass before the agent uses it.
//
// Identities are parsed once where they enter the agent (the configuration,
// the pod index, a CA's answer) and passed as values from there on.
//
// It owns no state and starts no goroutines; every function is safe for
// concurrent use. Private keys never leave memory through this package except as
// bytes handed back to the caller.
package pki

// Package tlspolicy applies COMPLIANCE_POLICY (docs/operations.md) to the
// TLS client configurations of the connections the agent makes (the CA and
// the control plane), as pilot-agent does: which TLS versions, cipher
// suites and key exchanges may be used. It also names the crypto module in
// force (Go's FIPS 140-3 module and its mode).
//
// It owns no connection and no state: Apply changes a *tls.Config before
// it is used.
package tlspolicy

// Package localca is a certificate authority that lives in memory: a fresh
// self-signed root (and optionally an intermediate) that issues workload and
// TLS server certificates. It backs `meshagent run --dev` and the protocol test
// servers in test/.
//
// A CA is immutable after New and safe for concurrent use. Its keys never
// leave memory.
package localca

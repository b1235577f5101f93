// Package xdsserver runs a real go-control-plane aggregated discovery server
// on loopback for tests: the snapshot cache and the v3 SotW and delta servers
// from github.com/envoyproxy/go-control-plane, served over TLS with a
// certificate from a localca.CA (or in plaintext), behind a bearer-token check
// like a control plane's.
//
// It owns its listener, its gRPC server and its snapshot cache; it records
// what each stream presented (metadata, client certificate) and every request
// it received, so tests can assert what a client sent. It does not stand in
// for istiod's behaviour beyond what go-control-plane does.
//
// A Server is safe for concurrent use. Restart keeps the address and the
// snapshot cache: a client sees the connection drop and comes back to the same
// snapshots, as after a control-plane restart.
package xdsserver

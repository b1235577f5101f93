// Package grpcbootstrap writes the xDS bootstrap file that proxyless gRPC
// applications read from GRPC_XDS_BOOTSTRAP (docs/configuration.md).
//
// The bootstrap points gRPC at the agent's xDS proxy over its Unix socket,
// by absolute path (pilot-agent writes a path that is only right when its
// working directory is /), and names one certificate provider, "default", a
// file_watcher over the OUTPUT_CERTS files, whose refresh interval follows
// the certificate lifetime (see RefreshInterval).
//
// It does not write the certificates (outputcerts does), does not run the
// xDS proxy, and does not decide the node ID or metadata (cmd/agent passes
// them in).
//
// The package holds no state and starts no goroutines; its functions are
// safe for concurrent use.
package grpcbootstrap

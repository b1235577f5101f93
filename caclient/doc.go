// Package caclient speaks the mesh CA protocols. It owns the Client interface
// that the secret manager calls, and the transport every protocol shares: a gRPC
// connection whose TLS peer is verified against the current trust roots (which
// may change at run time), optional client certificates, extra metadata, and the
// rule that a bearer token is only ever sent to a verified CA or over loopback.
// A call the peer refuses with Unauthenticated is reported to a token fetcher
// that keeps tokens (credfetcher.Invalidator), so the next call carries a new
// one. Conn is the connection a protocol client keeps to its CA: dialled on
// first use or by Preconnect, dropped after a call that failed in the
// transport (never after a status the CA answered, which would cancel other
// identities' calls in flight), closed once.
//
// The protocols live in sub-packages: caclient/istio (IstioCertificateService)
// and caclient/linkerd (Identity.Certify). Clients are safe for concurrent use;
// none of them starts goroutines of its own beyond what gRPC does.
package caclient

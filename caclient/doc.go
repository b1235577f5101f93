// Package caclient speaks the mesh CA protocols. It owns the Client interface
// that the secret manager calls, and Conn, the connection a protocol client
// keeps to its CA over internal/controlplane (peer verified against the
// current roots, a token only to a verified peer or over loopback): dialled on
// first use or by Preconnect, dropped after a call that failed in the
// transport (never after a status the CA answered, which would cancel other
// identities' calls in flight), closed once.
//
// The protocols live in sub-packages: caclient/istio (IstioCertificateService)
// and caclient/linkerd (Identity.Certify). Clients are safe for concurrent use;
// none of them starts goroutines of its own beyond what gRPC does.
package caclient

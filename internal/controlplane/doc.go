// Package controlplane dials the mesh's control plane (the CA, the
// discovery server): a gRPC connection whose TLS peer is verified against
// the trust roots in force at each handshake (they may change at run time),
// with an optional client certificate asked for at each handshake, extra
// metadata, and the rule that a bearer token is only ever sent to a
// verified peer or over loopback (ErrUnverifiedPeer otherwise). A call the
// peer refuses with Unauthenticated is reported to a token fetcher that
// keeps tokens (credfetcher.Invalidator), so the next call carries a new
// one.
//
// It owns no connection after Dial returns and starts no goroutine beyond
// what gRPC does. caclient's Conn and the xDS proxy dial through it.
package controlplane

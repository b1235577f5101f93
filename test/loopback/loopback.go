// Package loopback holds what the protocol test servers in test/ share:
// they serve on loopback addresses only and can be stopped and started again
// on the same port (ListenAgain; GRPC for a gRPC server).
package loopback

import (
	"fmt"
	"net"
	"time"
)

// ListenAgain listens on addr again after a server on it was stopped,
// retrying while the port is still held by the closing listener, for at most
// within.
func ListenAgain(addr string, within time.Duration) (net.Listener, error) {
	deadline := time.Now().Add(within)
	for {
		lis, err := net.Listen("tcp", addr)
		if err == nil {
			return lis, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("listening again on %s: %w", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

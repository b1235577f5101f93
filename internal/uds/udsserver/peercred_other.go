//go:build !linux

package udsserver

import (
	"net"

	"github.com/meshagent/meshagent/internal/uds/caller"
)

// readPeerCred is not implemented off Linux.
func readPeerCred(*net.UnixConn) (caller.Cred, error) { return caller.Cred{}, errNoPeerCred }

// readyRead is empty off Linux: gRPC keeps its own read buffer per
// connection there.
type readyRead struct{}

func (*readyRead) init(*net.UnixConn) {}

// park hands every connection to gRPC at once off Linux.
func (*Server) park(*localConn) error { return nil }

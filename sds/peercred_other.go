//go:build !linux

package sds

import "net"

// readPeerCred is not implemented off Linux.
func readPeerCred(*net.UnixConn) (PeerCred, error) { return PeerCred{}, errNoPeerCred }

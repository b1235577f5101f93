package sds

import (
	"fmt"
	"net"
	"syscall"
)

// readPeerCred reads SO_PEERCRED of a connected Unix socket.
func readPeerCred(c *net.UnixConn) (PeerCred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return PeerCred{}, fmt.Errorf("reading peer credentials: %w", err)
	}
	var (
		ucred *syscall.Ucred
		serr  error
	)
	if err := raw.Control(func(fd uintptr) {
		ucred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return PeerCred{}, fmt.Errorf("reading peer credentials: %w", err)
	}
	if serr != nil {
		return PeerCred{}, fmt.Errorf("reading peer credentials: %w", serr)
	}
	return PeerCred{UID: ucred.Uid, GID: ucred.Gid, PID: ucred.Pid}, nil
}

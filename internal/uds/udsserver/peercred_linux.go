package udsserver

import (
	"fmt"
	"net"
	"syscall"

	"github.com/meshagent/meshagent/internal/uds/caller"
)

// readPeerCred reads SO_PEERCRED of a connected Unix socket.
func readPeerCred(c *net.UnixConn) (caller.Cred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return caller.Cred{}, fmt.Errorf("reading peer credentials: %w", err)
	}
	var (
		ucred *syscall.Ucred
		serr  error
	)
	if err := raw.Control(func(fd uintptr) {
		ucred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return caller.Cred{}, fmt.Errorf("reading peer credentials: %w", err)
	}
	if serr != nil {
		return caller.Cred{}, fmt.Errorf("reading peer credentials: %w", serr)
	}
	return caller.Cred{UID: ucred.Uid, GID: ucred.Gid, PID: ucred.Pid}, nil
}

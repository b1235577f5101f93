//go:build !linux

package peerpidfd

import (
	"errors"
	"syscall"
)

var errLinuxOnly = errors.New("pidfds are Linux only")

// FromConn is Linux only.
func FromConn(syscall.Conn) (int, error) { return -1, errLinuxOnly }

// PID is Linux only.
func PID(int) (int, error) { return 0, errLinuxOnly }

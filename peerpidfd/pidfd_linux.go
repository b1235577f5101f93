package peerpidfd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// soPeerPIDFD is SO_PEERPIDFD (Linux 6.5), the same number on every
// architecture that uses the generic socket options (amd64, arm64, riscv64).
const soPeerPIDFD = 77

// FromConn returns a pidfd of the process that connected to a Unix socket:
// SO_PEERPIDFD when the kernel has it, else pidfd_open of the SO_PEERCRED
// pid. The caller closes it.
func FromConn(conn syscall.Conn) (int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("reading the peer's pidfd: %w", err)
	}
	var (
		fd         = -1
		pid        int32
		serr, cerr error
	)
	if err := raw.Control(func(s uintptr) {
		fd, serr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, soPeerPIDFD)
		if serr != nil {
			var cred *unix.Ucred
			cred, cerr = unix.GetsockoptUcred(int(s), unix.SOL_SOCKET, unix.SO_PEERCRED)
			if cerr == nil {
				pid = cred.Pid
			}
		}
	}); err != nil {
		return -1, fmt.Errorf("reading the peer's pidfd: %w", err)
	}
	if serr == nil {
		return fd, nil
	}
	if !errors.Is(serr, unix.ENOPROTOOPT) {
		return -1, fmt.Errorf("reading the peer's pidfd: %w", serr)
	}
	if cerr != nil {
		return -1, fmt.Errorf("reading the peer's credentials: %w", cerr)
	}
	fd, err = unix.PidfdOpen(int(pid), 0)
	if err != nil {
		return -1, fmt.Errorf("opening a pidfd of the peer (pid %d): %w", pid, err)
	}
	return fd, nil
}

// PID returns the pid a pidfd names, from /proc/self/fdinfo: -1 once the
// process has exited and been reaped.
func PID(fd int) (int, error) {
	data, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("Pid:")); ok {
			return strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	return 0, errors.New("fd is not a pidfd")
}

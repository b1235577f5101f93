package peerpidfd

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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
	data, err := readFdinfo(fd)
	if err != nil {
		return 0, err
	}
	for len(data) > 0 {
		var line []byte
		line, data, _ = bytes.Cut(data, []byte{'\n'})
		if v, ok := bytes.CutPrefix(line, []byte("Pid:")); ok {
			return strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	return 0, errors.New("fd is not a pidfd")
}

// maxFdinfo bounds what is read of an fdinfo file; a pidfd's is about 100
// bytes.
const maxFdinfo = 4096

// readFdinfo reads /proc/self/fdinfo/<fd> into a buffer sized for a
// pidfd's, so that a caller's resolution allocates little.
func readFdinfo(fd int) ([]byte, error) {
	f, err := os.Open("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, 0, 256)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > maxFdinfo {
			return nil, fmt.Errorf("fdinfo of fd %d is larger than %d bytes", fd, maxFdinfo)
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

package podresolver

import (
	"bufio"
	"bytes"
	"context"
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

// PeerPIDFD returns a pidfd of the process that connected to a Unix socket
// (SO_PEERPIDFD): the kernel takes it at connect(), so it names that process
// even after its pid is reused. The caller closes it. It fails on kernels
// older than 6.5.
func PeerPIDFD(conn syscall.Conn) (int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("reading the peer's pidfd: %w", err)
	}
	fd, serr := -1, error(nil)
	if err := raw.Control(func(s uintptr) {
		fd, serr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, soPeerPIDFD)
	}); err != nil {
		return -1, fmt.Errorf("reading the peer's pidfd: %w", err)
	}
	if serr != nil {
		return -1, fmt.Errorf("reading the peer's pidfd: %w", serr)
	}
	return fd, nil
}

// pinned holds a pidfd of the process being resolved, taken before its
// /proc files are read.
type pinned struct {
	fd  int
	own bool
}

// pin takes a pidfd of pid: the connection's, when ctx carries one (after
// checking it still names pid), else a new one. Without pidfds (a test's
// /proc root) it pins nothing and the start-time check alone guards.
func (r *Resolver) pin(ctx context.Context, pid int32) (pinned, error) {
	if !r.pidfds {
		return pinned{fd: -1}, nil
	}
	if fd, ok := pidfdFromContext(ctx); ok {
		got, err := pidfdPID(fd)
		if err != nil {
			return pinned{}, refuse(ReasonProcUnreadable, "reading the pidfd of process %d: %v", pid, err)
		}
		if got != int(pid) {
			// -1: the connecting process has exited; its pid may now be
			// another process's.
			return pinned{}, refuse(ReasonProcessGone, "process %d that connected has exited", pid)
		}
		return pinned{fd: fd}, nil
	}
	fd, err := unix.PidfdOpen(int(pid), 0)
	if errors.Is(err, unix.ESRCH) {
		return pinned{}, refuse(ReasonProcessGone, "process %d has exited", pid)
	}
	if err != nil {
		return pinned{}, refuse(ReasonProcUnreadable, "opening a pidfd of process %d: %v", pid, err)
	}
	return pinned{fd: fd, own: true}, nil
}

// alive checks the pinned process has not exited: then what was read of
// /proc/<pid> since pinning was its.
func (p pinned) alive(pid int32) error {
	if p.fd < 0 {
		return nil
	}
	err := unix.PidfdSendSignal(p.fd, 0, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return refuse(ReasonProcessGone, "process %d exited during the lookup", pid)
	}
	if err != nil && !errors.Is(err, unix.EPERM) { // EPERM: alive, not ours to signal
		return refuse(ReasonProcUnreadable, "checking process %d: %v", pid, err)
	}
	return nil
}

func (p pinned) release() {
	if p.own {
		unix.Close(p.fd)
	}
}

// pidfdPID reads the pid a pidfd names from /proc/self/fdinfo: -1 once the
// process has exited and been reaped.
func pidfdPID(fd int) (int, error) {
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

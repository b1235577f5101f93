package podresolver

import (
	"context"
	"errors"

	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/internal/node/peerpidfd"
)

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
	if fd, ok := peerpidfd.FromContext(ctx); ok {
		got, err := peerpidfd.PID(fd)
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

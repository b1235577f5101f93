package brokerapi

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// processPin is a pidfd of a referenced process, taken before the process
// is resolved and held while its stream lasts: the resolver checks that
// what it read of /proc/<pid> was this process's, and the stream ends when
// this process exits, whoever gets its pid later.
type processPin struct {
	fd   int      // borrowed by the resolver through peerpidfd.NewContext
	file *os.File // owns fd; pollable (PIDFD_NONBLOCK), so waiting takes no thread
}

// errNoProcess: no process has the pid.
var errNoProcess = errors.New("no such process")

func pinProcess(pid int32) (*processPin, error) {
	fd, err := unix.PidfdOpen(int(pid), unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, errNoProcess
	}
	if err != nil {
		return nil, err
	}
	return &processPin{fd: fd, file: os.NewFile(uintptr(fd), "pidfd")}, nil
}

// exited returns a channel closed when the process exits, or when the pin
// is closed. A pidfd becomes readable when its process exits; the wait is
// the runtime's poller's, not a thread's.
func (p *processPin) exited() <-chan struct{} {
	ch := make(chan struct{})
	rc, err := p.file.SyscallConn()
	if err != nil {
		close(ch)
		return ch
	}
	go func() {
		defer close(ch)
		_ = rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, 0)
			return err != nil || n > 0
		})
	}()
	return ch
}

func (p *processPin) close() { _ = p.file.Close() }

// closeIfSet closes p unless it is nil.
func (p *processPin) closeIfSet() {
	if p != nil {
		p.close()
	}
}

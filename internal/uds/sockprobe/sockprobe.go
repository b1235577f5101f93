package sockprobe

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// State is what Probe found at a path.
type State int

const (
	// Absent: nothing is there.
	Absent State = iota
	// Alive: a socket that answered.
	Alive
	// Stale: a socket that did not answer in time.
	Stale
	// NotSocket: something that is not a socket (a file, a directory, a
	// link), or a path that cannot be looked at.
	NotSocket
)

func (s State) String() string {
	switch s {
	case Absent:
		return "absent"
	case Alive:
		return "alive"
	case Stale:
		return "stale"
	case NotSocket:
		return "not a socket"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Errors of RemoveStale, to branch on with errors.Is.
var (
	// ErrInUse: the socket answered; it belongs to a live process.
	ErrInUse = errors.New("socket in use")
	// ErrNotSocket: the path holds something other than a socket.
	ErrNotSocket = errors.New("not a socket")
)

// Answer reports whether the socket at path answers before ctx ends.
type Answer func(ctx context.Context, path string) error

// Connect answers when a process accepts a connection on the socket.
func Connect(ctx context.Context, path string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return err
	}
	return c.Close()
}

// GRPC answers when a gRPC connection to the socket becomes ready, i.e. a
// gRPC server completed the HTTP/2 handshake. A socket nobody listens on
// (a previous run's, left behind) refuses the connection at once and is
// reported at once, with an error wrapping syscall.ECONNREFUSED: gRPC would
// retry it until ctx ends, and an agent restarting on its old socket would
// wait out the whole timeout for nothing.
func GRPC(ctx context.Context, path string) error {
	if err := Connect(ctx, path); errors.Is(err, syscall.ECONNREFUSED) {
		return err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+abs, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if !conn.WaitForStateChange(ctx, s) {
			return fmt.Errorf("no gRPC answer (last state %s): %w", s, ctx.Err())
		}
	}
}

// Probe looks at path and, when it holds a socket, asks answer within
// timeout. It changes nothing on disk. The error says why a socket is
// Stale or a path is NotSocket.
func Probe(ctx context.Context, path string, timeout time.Duration, answer Answer) (State, error) {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Absent, nil
	}
	if err != nil {
		return NotSocket, err
	}
	if st.Mode().Type() != fs.ModeSocket {
		return NotSocket, fmt.Errorf("%w: %s is a %s", ErrNotSocket, path, describe(st.Mode()))
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := answer(ctx, path); err != nil {
		return Stale, fmt.Errorf("no answer within %s: %w", timeout, err)
	}
	return Alive, nil
}

// RemoveStale removes the socket at path if it does not answer within
// timeout, and reports whether it removed one. Nothing there is not an
// error; a live socket is ErrInUse and something else ErrNotSocket (both
// left in place).
func RemoveStale(ctx context.Context, path string, timeout time.Duration, answer Answer) (bool, error) {
	state, err := Probe(ctx, path, timeout, answer)
	switch state {
	case Absent:
		return false, nil
	case Alive:
		return false, fmt.Errorf("%w: %s", ErrInUse, path)
	case NotSocket:
		if !errors.Is(err, ErrNotSocket) {
			return false, fmt.Errorf("checking %s: %w", path, err)
		}
		return false, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("removing stale socket: %w", err)
	}
	return true, nil
}

func describe(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m.IsRegular():
		return "regular file"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	}
	return "special file"
}

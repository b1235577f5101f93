// Command podclient stands in for a pod's process in meshbench's node-mode
// figures: meshbench starts one per pod, moves it into the pod's cgroup, and
// has it connect to the agent's socket, so the agent sees a caller whose
// SO_PEERCRED pid is in that pod. The connection is handed to meshbench,
// which speaks SDS over it: the process itself stays a few hundred KB.
//
// Usage: podclient <socket>, with file descriptor 3 a Unix socket shared
// with meshbench. It reads one byte from fd 3 (meshbench has moved it into
// the pod's cgroup), connects to the socket, sends the connection over fd 3
// (SCM_RIGHTS), then connects again and sends that connection for each
// further byte read ('g'), until fd 3 is closed, and exits. Only the syscall
// package is used, to keep the binary and its memory small.
package main

import (
	"os"
	"syscall"
)

const ctl = 3

func main() {
	if len(os.Args) != 2 {
		fail("usage: podclient <socket>")
	}
	var b [1]byte
	if n, err := syscall.Read(ctl, b[:]); n != 1 || err != nil {
		fail("waiting for the go-ahead on fd 3 failed")
	}
	connect()
	// The connection lives on in meshbench; this process lives until
	// meshbench closes its end (or dies), connecting again when asked.
	for {
		n, err := syscall.Read(ctl, b[:])
		if n == 0 || (err != nil && err != syscall.EINTR) {
			os.Exit(0)
		}
		if n == 1 && b[0] == 'g' {
			connect()
		}
	}
}

// connect connects to the socket and sends the connection on fd 3.
func connect() {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		fail("socket: " + err.Error())
	}
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: os.Args[1]}); err != nil {
		fail("connecting to " + os.Args[1] + ": " + err.Error())
	}
	if err := syscall.Sendmsg(ctl, []byte{'c'}, syscall.UnixRights(fd), nil, 0); err != nil {
		fail("sending the connection on fd 3: " + err.Error())
	}
	_ = syscall.Close(fd)
}

func fail(msg string) {
	os.Stderr.WriteString("podclient: " + msg + "\n")
	os.Exit(1)
}

// Package handoff keeps the node agent's socket answering while the agent
// process is away (its container restarting).
//
// A holder, a process that outlives the agent's (the node chart's
// socket-holder container), keeps a descriptor of the listening socket pods
// connect to. The agent takes that socket from the holder over a private Unix
// socket, by descriptor passing (SCM_RIGHTS), and accepts on it; a pod's
// connection is accepted from the socket it connected to, so the kernel's
// peer credentials still name the pod. While the agent holds the socket the
// holder accepts nothing. When the agent's process ends, the kernel closes
// its end of the private connection and the holder answers on the socket:
// clients complete their HTTP/2 handshake (pilot-agent's check that the
// socket is alive passes, and it starts no server of its own on a mount it
// cannot write), and their calls wait until an agent takes the socket again;
// they then end with UNAVAILABLE, and the clients call again, now to the
// agent. docs/node-mode.md, "Restarts", says why.
//
// The protocol, on a stream socket: the agent sends 'T' (take); the holder
// answers 'K' with the descriptor, or 'N' when it holds none, in which case
// the agent binds the socket itself and sends 'G' (give) with its
// descriptor. The connection then stays open for as long as the agent
// serves. An agent whose holder went away (restarted) gives its socket to
// the next one.
package handoff

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/logkeys"
)

const (
	opTake  = 'T'
	opGive  = 'G'
	opKept  = 'K'
	opNone  = 'N'
	opShort = 1
)

// ErrNoSocket is returned by Take when the holder holds no socket: the
// caller binds its own and gives it with Attachment.Give.
var ErrNoSocket = errors.New("handoff: the holder holds no socket")

// withFd runs fn on f's descriptor. Never f.Fd() on a file of the net
// package: it puts the descriptor in blocking mode, and the mode belongs to
// the socket, shared with every process holding it: an accept of another
// holder's would then block where its poller cannot wake it.
func withFd(f *os.File, fn func(fd int) error) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := raw.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// sendFile writes op with f's descriptor attached.
func sendFile(c *net.UnixConn, op byte, f *os.File) error {
	return withFd(f, func(fd int) error {
		_, _, err := c.WriteMsgUnix([]byte{op}, unix.UnixRights(fd), nil)
		return err
	})
}

// recv reads one op and the descriptor attached to it, if any.
func recv(c *net.UnixConn) (byte, *os.File, error) {
	buf := make([]byte, opShort)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, nil, err
	}
	if n != 1 {
		return 0, nil, io.ErrUnexpectedEOF
	}
	var f *os.File
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return 0, nil, fmt.Errorf("handoff: control message: %w", err)
		}
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for i, fd := range fds {
				if i == 0 && f == nil {
					f = os.NewFile(uintptr(fd), "handoff")
				} else {
					unix.Close(fd)
				}
			}
		}
	}
	return buf[0], f, nil
}

// listenerOf makes a listener of a socket descriptor (dup'd; f stays
// open), after checking that it is a listening Unix stream socket.
func listenerOf(f *os.File) (*net.UnixListener, error) {
	var acc int
	err := withFd(f, func(fd int) error {
		var err error
		acc, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
		return err
	})
	if err != nil || acc != 1 {
		return nil, fmt.Errorf("handoff: the descriptor is not a listening socket (%v)", err)
	}
	// net.FileListener calls Fd, which puts a descriptor that came from the net
	// package in blocking mode for a moment: dup it into a plain file first.
	var dup int
	if err := withFd(f, func(fd int) error {
		var err error
		dup, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		return err
	}); err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	plain := os.NewFile(uintptr(dup), "handoff")
	defer plain.Close()
	l, err := net.FileListener(plain)
	if err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		l.Close()
		return nil, errors.New("handoff: the descriptor is not a Unix socket")
	}
	ul.SetUnlinkOnClose(false)
	return ul, nil
}

// Attachment is an agent's open connection to its holder: while it is open
// the holder leaves the socket to the agent.
type Attachment struct {
	path string
	log  *zap.Logger

	mu   sync.Mutex
	conn *net.UnixConn
}

func (a *Attachment) current() *net.UnixConn {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conn
}

// Take connects to the holder at path and asks for the socket it holds.
// It returns ErrNoSocket, with the attachment, when the holder holds none.
// A holder still serving another agent answers once that agent is gone;
// ctx bounds the wait.
func Take(ctx context.Context, path string, log *zap.Logger) (*net.UnixListener, *Attachment, error) {
	if log == nil {
		log = zap.NewNop()
	}
	conn, err := dialHolder(ctx, path)
	if err != nil {
		return nil, nil, err
	}
	a := &Attachment{path: path, conn: conn, log: log}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	defer conn.SetDeadline(time.Time{})
	if _, err := conn.Write([]byte{opTake}); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("handoff: %w", err)
	}
	op, f, err := recv(conn)
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("handoff: waiting for the holder: %w", err)
	}
	switch {
	case op == opNone:
		return nil, a, ErrNoSocket
	case op == opKept && f != nil:
		defer f.Close()
		lis, err := listenerOf(f)
		if err != nil {
			conn.Close()
			return nil, nil, err
		}
		return lis, a, nil
	default:
		if f != nil {
			f.Close()
		}
		conn.Close()
		return nil, nil, fmt.Errorf("handoff: unexpected answer %q", op)
	}
}

func dial(ctx context.Context, path string) (*net.UnixConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	return c.(*net.UnixConn), nil
}

// dialHolder dials the holder, waiting (until ctx ends) for one that is
// starting: the containers of a pod start side by side.
func dialHolder(ctx context.Context, path string) (*net.UnixConn, error) {
	for {
		c, err := dial(ctx, path)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("handoff: no socket holder answered: %w", err)
		}
		if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("handoff: no socket holder answered: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Give hands lis's socket to the holder, which answers on it once this
// agent is gone.
func (a *Attachment) Give(lis *net.UnixListener) error {
	f, err := lis.File()
	if err != nil {
		return fmt.Errorf("handoff: %w", err)
	}
	defer f.Close()
	if err := sendFile(a.current(), opGive, f); err != nil {
		return fmt.Errorf("handoff: %w", err)
	}
	return nil
}

// Keep gives the socket current returns to every later holder, until ctx
// ends: when the holder goes away (its process restarted), the next one
// that listens at the same path learns the socket from this agent.
func (a *Attachment) Keep(ctx context.Context, current func() *net.UnixListener) {
	for {
		// The holder never writes after the handoff: a read ends when it goes.
		conn := a.current()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = io.Copy(io.Discard, conn)
		}()
		select {
		case <-ctx.Done():
			conn.Close()
			<-done
			return
		case <-done:
		}
		conn.Close()
		if ctx.Err() != nil {
			return
		}
		a.log.Warn("the socket holder went away; giving the socket to the next one")
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			c, err := dial(ctx, a.path)
			if err != nil {
				continue
			}
			a.mu.Lock()
			a.conn = c
			a.mu.Unlock()
			if err := a.Give(current()); err != nil {
				a.log.Warn("giving the socket to its holder failed", zap.Error(err))
				c.Close()
				continue
			}
			break
		}
	}
}

// Close ends the attachment: the holder answers on the socket again.
func (a *Attachment) Close() error { return a.current().Close() }

// Holder keeps the socket at Path across the agent's restarts and lends it
// to the agent that connects at Private.
type Holder struct {
	// Path is the socket pods connect to.
	Path string
	// Private is the holder's own socket, reachable by the agent only.
	Private string
	// Logger; nil logs nothing.
	Logger *zap.Logger

	mu   sync.Mutex
	sock *os.File // the listening socket; nil until bound or given
}

// Holds says whether the holder has the socket (bound it, or was given it).
func (h *Holder) Holds() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sock != nil
}

func (h *Holder) socket() *os.File {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sock
}

func (h *Holder) setSocket(f *os.File) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sock != nil {
		h.sock.Close()
	}
	h.sock = f
}

// Run serves until ctx ends. At start it binds Path unless a process
// answers there (an agent that outlived the previous holder, which gives
// the socket when it connects).
func (h *Holder) Run(ctx context.Context) error {
	log := h.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String(logkeys.Socket, h.Path))
	priv, err := listenPrivate(h.Private)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		priv.Close()
	}()
	if !answers(ctx, h.Path) {
		if err := h.bind(); err != nil {
			return err
		}
		log.Info("socket bound; answering until an agent takes it")
	} else {
		log.Info("an agent answers on the socket; waiting for it to connect")
	}
	for {
		stop := h.hold(log)
		conn, err := priv.AcceptUnix()
		stop()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("handoff: %w", err)
		}
		h.serveAgent(ctx, conn, log)
	}
}

// serveAgent answers one agent and waits until it is gone.
func (h *Holder) serveAgent(ctx context.Context, conn *net.UnixConn, log *zap.Logger) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	for {
		op, f, err := recv(conn)
		if err != nil {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				log.Warn("the agent's connection failed", zap.Error(err))
			}
			log.Info("the agent is gone; answering on the socket")
			return
		}
		switch op {
		case opTake:
			if f != nil {
				f.Close()
			}
			if sock := h.socket(); sock == nil {
				_, err = conn.Write([]byte{opNone})
			} else {
				err = sendFile(conn, opKept, sock)
				log.Info("socket handed to the agent")
			}
		case opGive:
			if f == nil {
				log.Warn("the agent gave no descriptor")
				return
			}
			lis, lerr := listenerOf(f)
			if lerr != nil {
				f.Close()
				log.Warn("the agent gave something else than a listening socket", zap.Error(lerr))
				return
			}
			lis.Close() // a check only: f stays open
			h.setSocket(f)
			log.Info("socket received from the agent")
		default:
			if f != nil {
				f.Close()
			}
			log.Warn("unknown request from the agent", zap.Int(logkeys.Request, int(op)))
			return
		}
		if err != nil {
			log.Warn("answering the agent failed", zap.Error(err))
			return
		}
	}
}

// hold answers on the socket until stop is called: each call waits, then
// ends with UNAVAILABLE.
func (h *Holder) hold(log *zap.Logger) (stop func()) {
	sock := h.socket()
	if sock == nil {
		return func() {}
	}
	lis, err := listenerOf(sock)
	if err != nil {
		log.Error("the socket held cannot be served", zap.Error(err))
		return func() {}
	}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		<-stream.Context().Done()
		return status.Error(codes.Unavailable, "the node agent is restarting")
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	return func() {
		srv.Stop() // closes the listener's descriptor (h.sock stays open) and every held call
		<-done
	}
}

// bind listens on Path (under a temporary name, renamed onto it), 0666:
// pods' processes run as any uid.
func (h *Holder) bind() error {
	if err := os.MkdirAll(filepath.Dir(h.Path), 0o755); err != nil {
		return fmt.Errorf("handoff: %w", err)
	}
	tmp := filepath.Join(filepath.Dir(h.Path), "."+filepath.Base(h.Path)+".holder")
	_ = os.Remove(tmp)
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return fmt.Errorf("handoff: %w", err)
	}
	lis.SetUnlinkOnClose(false)
	defer lis.Close()
	if err := os.Chmod(tmp, 0o666); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("handoff: %w", err)
	}
	if err := os.Rename(tmp, h.Path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("handoff: %w", err)
	}
	f, err := lis.File()
	if err != nil {
		return fmt.Errorf("handoff: %w", err)
	}
	h.setSocket(f)
	return nil
}

// answers says whether a process accepts connections at path.
func answers(ctx context.Context, path string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// listenPrivate listens on the holder's own socket, 0600, replacing a socket
// a previous holder left.
func listenPrivate(path string) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("handoff: %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("handoff: %w", err)
		}
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("handoff: %w", err)
	}
	return lis, nil
}

// Package handoff keeps the node agent's socket answering while the agent
// process is away: its container restarting, or its whole pod gone (an
// upgrade, a deletion).
//
// A holder, a process that outlives the agent's (the node chart's
// socket-holder container, in a pod of its own), keeps a descriptor of the
// listening socket pods connect to. The agent takes that socket from the
// holder over a private Unix socket, by descriptor passing (SCM_RIGHTS),
// and accepts on it; a pod's connection is accepted from the socket it
// connected to, so the kernel's peer credentials still name the pod. While
// the agent holds the socket the holder accepts nothing. When the agent's
// process ends, the kernel closes its end of the private connection and
// the holder accepts on the socket: it writes the server's part of the
// HTTP/2 handshake (an empty SETTINGS frame: every setting at its default)
// and reads nothing, so the client's handshake completes (pilot-agent's
// check that the socket is alive passes, and it starts no server of its
// own on a mount it cannot write) and what the client sends waits, unread,
// in the connection. When an agent takes the socket, the holder hands it
// these connections too: the agent reads the client's preface and requests
// as if they had just arrived and answers them on the same connection, so
// the clients are served without calling again. docs/node-mode.md,
// "Restarts", says why.
//
// The protocol, on a stream socket that only the holder's own uid may use:
// the agent sends 'T' (take); the holder answers 'K' with the listening
// socket's descriptor, then 'C' with each connection it accepted while no
// agent was there, then 'E'; or 'N' when it holds no socket, in which case
// the agent binds the socket itself and sends 'G' (give) with its
// descriptor. The connection then stays open for as long as the agent
// serves. An agent whose holder went away (restarted) gives its socket to
// the next one.
//
// Holders and agents of different versions meet (the node socket pod is
// replaced only when deleted: docs/operations.md), so these bytes never
// change meaning: a later version may add an op, which a holder that does
// not know it answers by closing that agent's connection, keeping the
// connections it holds for the next agent. protocol_test.go pins the bytes.
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

	"github.com/meshagent/meshagent/internal/logkeys"
)

const (
	opTake  = 'T'
	opGive  = 'G'
	opKept  = 'K'
	opConn  = 'C'
	opEnd   = 'E'
	opNone  = 'N'
	opShort = 1
)

// DefaultMaxParked is Holder.MaxParked's default.
const DefaultMaxParked = 1024

// DefaultSweepInterval is Holder.SweepInterval's default.
const DefaultSweepInterval = time.Second

// settingsFrame is the server's part of the HTTP/2 handshake as the holder
// writes it: a SETTINGS frame with no setting (each at its default).
var settingsFrame = []byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0}

// ErrNoSocket is returned by Take when the holder holds no socket: the
// caller binds its own and gives it with Attachment.Give.
var ErrNoSocket = errors.New("handoff: the holder holds no socket")

// withFd runs fn on c's descriptor. Never Fd() on a file of the net
// package: it puts the descriptor in blocking mode, and the mode belongs to
// the socket, shared with every process holding it: an accept of another
// holder's would then block where its poller cannot wake it.
func withFd(c syscall.Conn, fn func(fd int) error) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := raw.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// sendFile writes op with c's descriptor attached.
func sendFile(to *net.UnixConn, op byte, c syscall.Conn) error {
	return withFd(c, func(fd int) error {
		_, _, err := to.WriteMsgUnix([]byte{op}, unix.UnixRights(fd), nil)
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

// dupPlain duplicates f's descriptor into a plain file: net.FileListener
// and net.FileConn call Fd, which puts a descriptor that came from the net
// package in blocking mode for a moment.
func dupPlain(f *os.File) (*os.File, error) {
	var dup int
	if err := withFd(f, func(fd int) error {
		var err error
		dup, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		return err
	}); err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	return os.NewFile(uintptr(dup), "handoff"), nil
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
	plain, err := dupPlain(f)
	if err != nil {
		return nil, err
	}
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

// connOf makes a connection of a descriptor the holder handed over (f is
// closed).
func connOf(f *os.File) (*net.UnixConn, error) {
	defer f.Close()
	plain, err := dupPlain(f)
	if err != nil {
		return nil, err
	}
	defer plain.Close()
	c, err := net.FileConn(plain)
	if err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, errors.New("handoff: a handed-over descriptor is not a Unix connection")
	}
	return uc, nil
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

// Taken is what Take got from the holder.
type Taken struct {
	// Listener is the socket pods connect to.
	Listener *net.UnixListener
	// Waiting are the connections the holder accepted while no agent was
	// there, in the order they came: their clients' preface and requests
	// are unread. The caller serves them as new connections.
	Waiting []*net.UnixConn
}

// Take connects to the holder at path and asks for the socket it holds and
// the connections waiting on it. It returns ErrNoSocket, with the
// attachment, when the holder holds none. A holder still serving another
// agent answers once that agent is gone; ctx bounds the wait.
func Take(ctx context.Context, path string, log *zap.Logger) (*Taken, *Attachment, error) {
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
	fail := func(t *Taken, err error) (*Taken, *Attachment, error) {
		if t != nil {
			t.Close()
		}
		conn.Close()
		return nil, nil, err
	}
	if _, err := conn.Write([]byte{opTake}); err != nil {
		return fail(nil, fmt.Errorf("handoff: %w", err))
	}
	op, f, err := recv(conn)
	if err != nil {
		return fail(nil, fmt.Errorf("handoff: waiting for the holder: %w", err))
	}
	switch {
	case op == opNone:
		if f != nil {
			f.Close()
		}
		return nil, a, ErrNoSocket
	case op == opKept && f != nil:
		lis, err := listenerOf(f)
		f.Close()
		if err != nil {
			return fail(nil, err)
		}
		t := &Taken{Listener: lis}
		for {
			op, f, err := recv(conn)
			if err != nil {
				return fail(t, fmt.Errorf("handoff: receiving the waiting connections: %w", err))
			}
			switch {
			case op == opEnd:
				if f != nil {
					f.Close()
				}
				return t, a, nil
			case op == opConn && f != nil:
				c, err := connOf(f)
				if err != nil {
					// One connection lost: its client calls again.
					log.Warn("a waiting connection could not be taken", zap.Error(err))
					continue
				}
				t.Waiting = append(t.Waiting, c)
			default:
				if f != nil {
					f.Close()
				}
				return fail(t, fmt.Errorf("handoff: unexpected answer %q among the waiting connections", op))
			}
		}
	default:
		if f != nil {
			f.Close()
		}
		return fail(nil, fmt.Errorf("handoff: unexpected answer %q", op))
	}
}

// Close closes the listener and every waiting connection.
func (t *Taken) Close() {
	if t.Listener != nil {
		t.Listener.Close()
	}
	for _, c := range t.Waiting {
		c.Close()
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
// starting: the agent's and the holder's pods start independently.
func dialHolder(ctx context.Context, path string) (*net.UnixConn, error) {
	for {
		c, err := dial(ctx, path)
		if err == nil {
			return c, nil
		}
		// The dial can time out at ctx's deadline a moment before ctx says so.
		var ne net.Error
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
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
	if err := sendFile(a.current(), opGive, lis); err != nil {
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
	// Private is the holder's own socket, reachable by the agent only
	// (the holder also refuses a process of another uid than its own).
	Private string
	// MaxParked bounds the connections kept while no agent is there (a
	// connection is a descriptor and a few hundred bytes of the kernel's);
	// one more is closed at once, and its client calls again. Default
	// DefaultMaxParked.
	MaxParked int
	// SweepInterval is how often the connections kept are looked at, to
	// let go of those whose client went away. Default DefaultSweepInterval.
	SweepInterval time.Duration
	// Logger; nil logs nothing.
	Logger *zap.Logger

	mu     sync.Mutex
	sock   *os.File // the listening socket; nil until bound or given
	parked int      // connections kept now, for Parked
}

// Holds says whether the holder has the socket (bound it, or was given it).
func (h *Holder) Holds() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sock != nil
}

// Parked is the number of connections the holder keeps for the next agent.
func (h *Holder) Parked() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.parked
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

func (h *Holder) setParked(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.parked = n
}

// Run serves until ctx ends. At start it binds Path unless a process
// answers there (an agent that outlived the previous holder, which gives
// the socket when it connects).
func (h *Holder) Run(ctx context.Context) error {
	log := h.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if h.MaxParked <= 0 {
		h.MaxParked = DefaultMaxParked
	}
	if h.SweepInterval <= 0 {
		h.SweepInterval = DefaultSweepInterval
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
	// One parking lasts until an agent takes the socket (or gives one): an
	// agent that goes before it takes (it crashed, or asked for something
	// this holder does not know) leaves the kept connections kept.
	var p *parking
	for {
		if p == nil {
			p = h.park(log)
		}
		conn, err := h.acceptAgent(priv, log)
		if err != nil {
			closeAll(p.stop())
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("handoff: %w", err)
		}
		h.serveAgent(ctx, conn, p, log)
		if p.stopped() || (p.lis == nil && h.socket() != nil) {
			closeAll(p.stop()) // nothing, or what a failed hand-over left
			p = nil
		}
	}
}

// acceptAgent accepts the next connection on the private socket from a
// process of the holder's own uid (the agent's); others are refused.
func (h *Holder) acceptAgent(priv *net.UnixListener, log *zap.Logger) (*net.UnixConn, error) {
	for {
		conn, err := priv.AcceptUnix()
		if err != nil {
			return nil, err
		}
		var cred *unix.Ucred
		err = withFd(conn, func(fd int) error {
			var err error
			cred, err = unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
			return err
		})
		if err == nil && int(cred.Uid) == os.Getuid() {
			return conn, nil
		}
		if err != nil {
			log.Warn("refused a connection on the private socket: its credentials cannot be read", zap.Error(err))
		} else {
			log.Warn("refused a connection on the private socket: not the agent's uid", zap.Uint32(logkeys.UID, cred.Uid), zap.Int32(logkeys.PID, cred.Pid))
		}
		conn.Close()
	}
}

// serveAgent answers one agent and waits until it is gone. p is the
// parking in progress, stopped (its connections handed over) when the
// agent takes the socket.
func (h *Holder) serveAgent(ctx context.Context, conn *net.UnixConn, p *parking, log *zap.Logger) {
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
			sock := h.socket()
			if sock == nil {
				_, err = conn.Write([]byte{opNone})
				break
			}
			waiting := p.stop()
			err = h.handOver(conn, sock, waiting, log)
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

// handOver sends the agent the socket and the connections kept for it,
// then closes the holder's copies of those connections.
func (h *Holder) handOver(conn *net.UnixConn, sock *os.File, waiting []*net.UnixConn, log *zap.Logger) error {
	defer closeAll(waiting)
	if err := sendFile(conn, opKept, sock); err != nil {
		return err
	}
	for _, c := range waiting {
		if err := sendFile(conn, opConn, c); err != nil {
			return err
		}
	}
	if _, err := conn.Write([]byte{opEnd}); err != nil {
		return err
	}
	log.Info("socket handed to the agent", zap.Int(logkeys.Connections, len(waiting)))
	return nil
}

// parking accepts on the socket while no agent holds it: each connection
// gets the server's SETTINGS and is kept, unread, for the next agent.
type parking struct {
	h    *Holder
	log  *zap.Logger
	lis  *net.UnixListener // nil: the holder holds no socket
	quit chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex
	conns  []*net.UnixConn
	fds    []int // conns' descriptors, for the sweep
	full   bool  // a connection was refused for MaxParked (logged once)
	done   bool
	result []*net.UnixConn
}

// park starts accepting on the socket held, if any.
func (h *Holder) park(log *zap.Logger) *parking {
	p := &parking{h: h, log: log, quit: make(chan struct{})}
	sock := h.socket()
	if sock == nil {
		return p
	}
	lis, err := listenerOf(sock)
	if err != nil {
		log.Error("the socket held cannot be served", zap.Error(err))
		return p
	}
	p.lis = lis
	p.wg.Add(2)
	go p.accept()
	go p.sweep()
	return p
}

func (p *parking) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.AcceptUnix()
		if err != nil {
			return // closed by stop
		}
		p.keep(c)
	}
}

// keep writes the server's SETTINGS to c and keeps it.
func (p *parking) keep(c *net.UnixConn) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(settingsFrame); err != nil {
		c.Close()
		return
	}
	_ = c.SetWriteDeadline(time.Time{})
	fd := -1
	_ = withFd(c, func(f int) error { fd = f; return nil })
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done || fd < 0 {
		c.Close()
		return
	}
	if len(p.conns) >= p.h.MaxParked {
		if !p.full {
			p.full = true
			p.log.Warn("too many connections waiting for the agent; closing the newest", zap.Int(logkeys.Connections, len(p.conns)))
		}
		c.Close()
		return
	}
	p.conns = append(p.conns, c)
	p.fds = append(p.fds, fd)
	p.h.setParked(len(p.conns))
}

// sweep lets go of the kept connections whose client went away (closed, or
// shut its side down), every SweepInterval.
func (p *parking) sweep() {
	defer p.wg.Done()
	t := time.NewTicker(p.h.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return
		case <-t.C:
		}
		p.mu.Lock()
		if len(p.fds) > 0 {
			pfds := make([]unix.PollFd, len(p.fds))
			for i, fd := range p.fds {
				pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLRDHUP}
			}
			if _, err := unix.Poll(pfds, 0); err == nil {
				keep := 0
				for i, pf := range pfds {
					if pf.Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
						p.conns[i].Close()
						continue
					}
					p.conns[keep], p.fds[keep] = p.conns[i], p.fds[i]
					keep++
				}
				clear(p.conns[keep:])
				p.conns, p.fds = p.conns[:keep], p.fds[:keep]
				p.h.setParked(keep)
			}
		}
		p.mu.Unlock()
	}
}

// stopped reports whether stop was called.
func (p *parking) stopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// stop ends the parking and returns the connections kept, oldest first;
// later calls return nothing.
func (p *parking) stop() []*net.UnixConn {
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		return nil
	}
	p.done = true
	p.mu.Unlock()
	if p.lis != nil {
		p.lis.Close() // the listener's descriptor; h.sock stays open, listening
		close(p.quit)
		p.wg.Wait()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.conns
	p.conns, p.fds = nil, nil
	p.h.setParked(0)
	return out
}

func closeAll(conns []*net.UnixConn) {
	for _, c := range conns {
		c.Close()
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

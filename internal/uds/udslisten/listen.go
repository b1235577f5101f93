package udslisten

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/files/filewatch"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/uds/handoff"
	"github.com/meshagent/meshagent/internal/uds/sockprobe"
)

// Defaults of Config.
const (
	// DefaultDirMode is the mode of directories created for the socket.
	DefaultDirMode = 0o750
	// DefaultSocketMode is the socket's mode, as pilot-agent sets it.
	DefaultSocketMode = 0o666
	// DefaultCheckInterval is how long Watch waits before looking again
	// after a rebind, and how often it looks while the socket's directory
	// cannot be watched.
	DefaultCheckInterval = time.Second
	// MaxPath is the longest path a Unix socket address holds.
	MaxPath = 107
	// maxBackoff bounds the wait between checks while the socket keeps being
	// replaced (say, two agents set on the same path).
	maxBackoff = time.Minute
	// probeTimeout bounds the dial that tells a live socket from a stale one.
	probeTimeout = time.Second
)

// Reasons a socket is bound again, passed to Config.OnRebind.
const (
	ReasonRemoved  = "removed"
	ReasonReplaced = "replaced"
)

// Errors of Listen, to branch on with errors.Is.
var (
	// ErrInUse: another process answers on the path (Replace not set).
	ErrInUse = sockprobe.ErrInUse
	// ErrNotSocket: something other than a socket is at the path (Replace
	// not set).
	ErrNotSocket = sockprobe.ErrNotSocket
)

// Config describes a socket to listen on. Zero values get the defaults noted.
type Config struct {
	// Path is the socket's path. Required; at most MaxPath bytes.
	Path string
	// DirMode is the mode of the directories created on the way to the
	// socket. Default DefaultDirMode. Existing directories are left alone.
	DirMode os.FileMode
	// SocketMode is the socket's mode. Default DefaultSocketMode.
	SocketMode os.FileMode
	// Replace replaces whatever is at the path at start (a socket another
	// process answers on, a regular file), rather than failing.
	Replace bool
	// CheckInterval is how long Watch waits before looking at the path
	// again after a rebind (doubling while the path keeps being taken), and
	// how often it looks while the directory cannot be watched. Default
	// DefaultCheckInterval.
	CheckInterval time.Duration
	// Clock drives Watch; nil means the real clock.
	Clock clock.WithTicker
	// OnRebind, when set, is called after the socket was bound again, with
	// ReasonRemoved or ReasonReplaced (for a metric).
	OnRebind func(reason string)
	// Logger receives the listener's logs; nil means none.
	Logger *zap.Logger
	// Handoff, when set, is the private socket of a holder
	// (internal/uds/handoff) that keeps the socket while this process is
	// away: Listen takes the socket from it (or binds it and gives it), and
	// Close leaves the socket to it rather than removing it.
	Handoff string

	// afterCheck, when set, is called after each of Watch's checks (tests).
	afterCheck func(rebound bool)
}

// Listener is a net.Listener on a socket it keeps. Create it with Listen.
type Listener struct {
	cfg Config
	log *zap.Logger

	mu     sync.Mutex
	cur    *net.UnixListener
	ours   os.FileInfo // the socket file cur is bound to
	closed bool
	done   chan struct{} // closed by Close

	att      *handoff.Attachment // the holder's, with Handoff
	stopKeep func()              // ends att.Keep
	waiting  []net.Conn          // taken from the holder, for Accept first
}

// handoffTimeout bounds the wait for the socket's holder, which answers once
// the agent before this one is gone.
const handoffTimeout = 30 * time.Second

var _ net.Listener = (*Listener)(nil)

// Listen binds the socket described by cfg.
func Listen(cfg Config) (*Listener, error) {
	if cfg.Path == "" {
		return nil, errors.New("unix socket: no path")
	}
	if len(cfg.Path) > MaxPath {
		return nil, fmt.Errorf("unix socket: path %q is longer than %d bytes", cfg.Path, MaxPath)
	}
	if cfg.DirMode == 0 {
		cfg.DirMode = DefaultDirMode
	}
	if cfg.SocketMode == 0 {
		cfg.SocketMode = DefaultSocketMode
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = DefaultCheckInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	l := &Listener{cfg: cfg, log: cfg.Logger.With(zap.String(logkeys.Socket, cfg.Path)), done: make(chan struct{})}
	if err := mkdirs(filepath.Dir(cfg.Path), cfg.DirMode); err != nil {
		return nil, fmt.Errorf("creating socket directory: %w", err)
	}
	if cfg.Handoff != "" {
		return l.take()
	}
	if !cfg.Replace {
		removed, err := sockprobe.RemoveStale(context.Background(), cfg.Path, probeTimeout, sockprobe.Connect)
		if err != nil {
			return nil, fmt.Errorf("unix socket: %w", err)
		}
		if removed {
			l.log.Info("removed stale socket")
		}
	} else if st, err := os.Lstat(cfg.Path); err == nil {
		l.log.Warn("replacing what is at the socket path", zap.String(logkeys.Found, describe(st.Mode())))
	}
	lis, info, err := l.bind()
	if err != nil {
		return nil, err
	}
	l.cur, l.ours = lis, info
	return l, nil
}

// take gets the socket from its holder, or binds it and gives it to the
// holder when the holder has none.
func (l *Listener) take() (*Listener, error) {
	ctx, cancel := context.WithTimeout(context.Background(), handoffTimeout)
	defer cancel()
	taken, att, err := handoff.Take(ctx, l.cfg.Handoff, l.log)
	switch {
	case err == nil:
		info, serr := os.Lstat(l.cfg.Path)
		if serr != nil {
			taken.Close()
			att.Close()
			return nil, fmt.Errorf("unix socket: the holder's socket: %w", serr)
		}
		l.cur, l.ours = taken.Listener, info
		for _, c := range taken.Waiting {
			l.waiting = append(l.waiting, c)
		}
		l.log.Info("socket taken from its holder", zap.Int(logkeys.Connections, len(taken.Waiting)))
	case errors.Is(err, handoff.ErrNoSocket):
		lis, info, err := l.bind()
		if err != nil {
			att.Close()
			return nil, err
		}
		if err := att.Give(lis); err != nil {
			lis.Close()
			att.Close()
			return nil, err
		}
		l.cur, l.ours = lis, info
		l.log.Info("socket bound and given to its holder")
	default:
		return nil, fmt.Errorf("unix socket: %w", err)
	}
	l.att = att
	ctx, stop := context.WithCancel(context.Background())
	l.stopKeep = stop
	go att.Keep(ctx, func() *net.UnixListener {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.cur
	})
	return l, nil
}

// bind listens under a temporary name in the socket's directory and renames
// the socket onto the path, replacing what is there.
func (l *Listener) bind() (*net.UnixListener, os.FileInfo, error) {
	path := l.cfg.Path
	tmp := tempName(path)
	if len(tmp) > MaxPath {
		// No room for a temporary name: clear the path and bind on it.
		tmp = path
		if err := removeNonDir(path); err != nil {
			return nil, nil, err
		}
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("listening on socket: %w", err)
	}
	lis.SetUnlinkOnClose(false) // only Close removes the socket, if still ours
	fail := func(err error) (*net.UnixListener, os.FileInfo, error) {
		_ = lis.Close()
		_ = os.Remove(tmp)
		return nil, nil, err
	}
	if err := os.Chmod(tmp, l.cfg.SocketMode); err != nil {
		return fail(fmt.Errorf("setting socket mode: %w", err))
	}
	info, err := os.Lstat(tmp)
	if err != nil {
		return fail(fmt.Errorf("reading the bound socket: %w", err))
	}
	if tmp != path {
		if err := os.Rename(tmp, path); err != nil {
			return fail(fmt.Errorf("putting the socket at its path: %w", err))
		}
	}
	return lis, info, nil
}

// Accept returns the connections taken from the holder, which waited for
// this process, then waits for the next connection on the socket bound last.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		cur, closed := l.cur, l.closed
		var next net.Conn
		if !closed && len(l.waiting) > 0 {
			next = l.waiting[0]
			l.waiting[0] = nil
			l.waiting = l.waiting[1:]
		}
		l.mu.Unlock()
		if closed {
			return nil, net.ErrClosed
		}
		if next != nil {
			return next, nil
		}
		c, err := cur.Accept()
		if err == nil {
			return c, nil
		}
		l.mu.Lock()
		retired := l.cur != cur && !l.closed
		l.mu.Unlock()
		if !retired {
			return nil, err
		}
	}
}

// Addr is the socket's address.
func (l *Listener) Addr() net.Addr { return &net.UnixAddr{Name: l.cfg.Path, Net: "unix"} }

// Close stops listening and removes the socket if it is still the one bound
// last. It is safe to call twice.
func (l *Listener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.done)
	for _, c := range l.waiting {
		_ = c.Close()
	}
	l.waiting = nil
	err := l.cur.Close()
	if l.att != nil {
		// The holder answers on the socket from now on.
		l.stopKeep()
		_ = l.att.Close()
		return err
	}
	if now, serr := os.Lstat(l.cfg.Path); serr == nil && os.SameFile(now, l.ours) {
		if rerr := os.Remove(l.cfg.Path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			l.log.Warn("removing socket failed", zap.Error(rerr))
		}
	}
	return err
}

// Watch binds the socket again when it was removed or replaced, until ctx
// ends or the listener is closed; it then returns nil.
//
// It waits on inotify events in the socket's directory (shared with the
// process's file watches), so an idle agent is never woken by it: a check
// (one lstat) follows each event at once. After a rebind it looks again
// CheckInterval later, doubling the wait up to maxBackoff while something
// keeps taking the path (events meanwhile wait for that check); a failed
// bind is logged and retried the same way. While the directory cannot be
// watched (gone and not made again, no inotify instance to be had) it
// looks every CheckInterval and tries to watch again.
func (l *Listener) Watch(ctx context.Context) error {
	dw := filewatch.WatchDir(filepath.Dir(l.cfg.Path))
	defer dw.Close()
	var (
		backoff time.Duration // 0: no rebind since the last good check
		timer   clock.Timer   // the next check, when one is due without an event
		timerC  <-chan time.Time
	)
	schedule := func(d time.Duration) {
		if timer == nil {
			timer = l.cfg.Clock.NewTimer(d)
			timerC = timer.C()
		}
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	watching := l.watchDir(dw)
	checkNow := true // the socket may have gone between Listen and Watch
	for {
		if !checkNow {
			if !watching {
				schedule(l.cfg.CheckInterval)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-l.done:
				return nil
			case <-dw.Events():
				if timer != nil || backoff > 0 {
					schedule(backoff) // a check is due already, or we back off
					continue
				}
			case <-timerC:
				timer, timerC = nil, nil
			}
		}
		checkNow = false
		rebound, err := l.check()
		if l.cfg.afterCheck != nil {
			l.cfg.afterCheck(rebound)
		}
		// After the check: a directory removed and made again needs a new watch.
		watching = l.watchDir(dw)
		switch {
		case err != nil:
			l.log.Error("socket lost and not bound again; trying again later", zap.Error(err))
		case !rebound:
			backoff = 0
			continue
		}
		// Rebound or failed: look again later, less often while it goes on.
		if backoff == 0 {
			backoff = l.cfg.CheckInterval
		} else {
			backoff = min(2*backoff, maxBackoff)
		}
		schedule(backoff)
	}
}

// watchDir (re-)establishes dw's watch and says whether it holds.
func (l *Listener) watchDir(dw *filewatch.DirWatch) bool {
	if err := dw.Watch(); err != nil {
		l.log.Debug("socket directory not watched; checking periodically", zap.Error(err))
		return false
	}
	return true
}

// check binds the socket again if the path no longer holds it.
func (l *Listener) check() (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false, nil
	}
	now, err := os.Lstat(l.cfg.Path)
	if err == nil && os.SameFile(now, l.ours) {
		return false, nil
	}
	reason, found := ReasonReplaced, ""
	switch {
	case errors.Is(err, fs.ErrNotExist):
		reason = ReasonRemoved
	case err != nil:
		return false, fmt.Errorf("looking at the socket: %w", err)
	default:
		found = describe(now.Mode())
	}
	if err := mkdirs(filepath.Dir(l.cfg.Path), l.cfg.DirMode); err != nil {
		return false, fmt.Errorf("creating socket directory: %w", err)
	}
	lis, info, err := l.bind()
	if err != nil {
		return false, err
	}
	old := l.cur
	l.cur, l.ours = lis, info
	_ = old.Close() // wakes an Accept waiting on it, which moves to lis
	if l.att != nil {
		if err := l.att.Give(lis); err != nil {
			l.log.Warn("giving the socket bound again to its holder failed", zap.Error(err))
		}
	}
	l.log.Warn("socket bound again", zap.String(logkeys.Reason, reason), zap.String(logkeys.Found, found))
	if l.cfg.OnRebind != nil {
		l.cfg.OnRebind(reason)
	}
	return true, nil
}

// mkdirs creates dir and its missing parents with mode (whatever the
// umask); directories that exist are left as they are.
func mkdirs(dir string, mode os.FileMode) error {
	st, err := os.Stat(dir)
	if err == nil {
		if !st.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirs(parent, mode); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, mode); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil // made meanwhile by someone else: theirs
		}
		return err
	}
	return os.Chmod(dir, mode)
}

func tempName(path string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return filepath.Join(filepath.Dir(path), "."+hex.EncodeToString(b[:])+".sock")
}

func removeNonDir(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.IsDir() {
		return fmt.Errorf("%w: %s is a directory", ErrNotSocket, path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("clearing the socket path: %w", err)
	}
	return nil
}

func describe(m fs.FileMode) string {
	switch {
	case m.Type() == fs.ModeSocket:
		return "socket"
	case m.IsDir():
		return "directory"
	case m.IsRegular():
		return "regular file"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	}
	return "special file"
}

// Server is what Serve serves on a listener: a *grpc.Server, or one whose
// Stop ends more than its connections first.
type Server interface {
	// Serve accepts connections on l until it fails or Stop is called.
	Serve(l net.Listener) error
	// Stop closes the listener and every connection and returns once the
	// server's handlers have returned (as the server waits for them).
	Stop()
}

// Serve serves srv on l and keeps the socket while it does (Watch), until
// ctx ends (then it returns nil) or srv.Serve fails (its error). Either
// way srv is stopped, the watch has ended and l is closed (its socket
// removed, if still its own) when Serve returns. The SDS socket and the
// xDS proxy's socket are served this way.
func (l *Listener) Serve(ctx context.Context, srv Server) error {
	defer l.Close()
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() { watched <- l.Watch(wctx) }()
	defer func() { stopWatch(); <-watched }()

	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	select {
	case <-ctx.Done():
		srv.Stop()
		<-served // nil, or an error of a Serve that began after Stop
		return nil
	case err := <-served:
		srv.Stop()
		return err
	}
}

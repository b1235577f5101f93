package fileprovider

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/files/regularfile"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/notify"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
)

// SystemRoots is the file-root: path that names the system trust bundle.
const SystemRoots = certfile.SystemRoots

// DefaultMaxResources bounds the number of names held at once.
const DefaultMaxResources = 64

// sourceName is the Source of every secret served here.
const sourceName = "file"

var (
	// ErrStopped is returned for a new name after Run has returned.
	ErrStopped = errors.New("file provider stopped")
	// ErrRunning is returned by a second Run.
	ErrRunning = errors.New("file provider is already running")
	// ErrTooMany is wrapped by the refusal of a name while MaxResources
	// names are held.
	ErrTooMany = errors.New("too many file resources held")
	// ErrOutsideDirs is wrapped by the refusal of a name whose file lies
	// outside Config.AllowedDirs.
	ErrOutsideDirs = errors.New("file outside the directories file resources may name")
)

// Config describes a Provider. Zero values get the defaults noted.
type Config struct {
	// Files configures the watched sources (debounce, poll interval, clock,
	// metrics); its Logger defaults to Logger.
	Files certfile.SourceConfig
	// MaxResources bounds how many names are held (watched) at once; further
	// names are refused until one is released. Default DefaultMaxResources.
	MaxResources int
	// AllowedDirs, when not nil, are the only directories whose files a name
	// may serve (a relative one is against the working directory): a path is
	// served only when it lies in one of them both as named and with its
	// symbolic links resolved. Nil serves any file the agent can read (for
	// an agent whose socket only trusted uids can reach).
	AllowedDirs []string
	// Logger is narrowed with .Named("fileprovider"). Nil means zap.NewNop().
	Logger *zap.Logger
}

// Provider serves file-cert: and file-root: resources.
type Provider struct {
	cfg     Config
	log     *zap.Logger
	version atomic.Uint64

	mu      sync.Mutex
	entries map[string]*entry // names with at least one watcher
	ctx     context.Context   // set while Run is active
	wg      sync.WaitGroup    // entry goroutines started by Run
	running bool
	stopped bool

	dirs []string // Config.AllowedDirs, absolute, links resolved; nil: any
}

// New returns a Provider. It starts nothing; see Run.
func New(cfg Config) *Provider {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Files.Logger == nil {
		cfg.Files.Logger = cfg.Logger
	}
	if cfg.MaxResources <= 0 {
		cfg.MaxResources = DefaultMaxResources
	}
	p := &Provider{cfg: cfg, log: cfg.Logger.Named("fileprovider"), entries: map[string]*entry{}}
	if cfg.AllowedDirs != nil {
		// Checked once when a name is first asked for (checkPath), and
		// at every load its files are opened beneath their directory: a
		// link put in later cannot lead out of it.
		p.cfg.Files.Open = p.openBeneath
		p.dirs = []string{}
		for _, d := range cfg.AllowedDirs {
			abs, err := filepath.Abs(d)
			if err != nil {
				continue
			}
			if real, err := filepath.EvalSymlinks(abs); err == nil {
				abs = real
			}
			p.dirs = append(p.dirs, abs)
		}
	}
	return p
}

// checkPath refuses a path outside the allowed directories, as named or
// through a symbolic link.
func (p *Provider) checkPath(path string) error {
	if p.dirs == nil {
		return nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrOutsideDirs, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrOutsideDirs, path, err)
	}
	for _, d := range p.dirs {
		if within(abs, d) && within(real, d) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s", ErrOutsideDirs, path)
}

// openBeneath opens path, which checkPath accepted, beneath the allowed
// directory it lies in (os.Root): a link met on the way, the file's own
// included, is followed only while it stays beneath that directory.
func (p *Provider) openBeneath(path string) (*os.File, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	err = fmt.Errorf("%w: %s", ErrOutsideDirs, path)
	for _, d := range p.dirs {
		if !within(abs, d) {
			continue
		}
		rel, rerr := filepath.Rel(d, abs)
		if rerr != nil {
			continue
		}
		var f *os.File
		if f, err = openIn(d, rel); err == nil {
			return f, nil
		}
		err = fmt.Errorf("%w: %s: %v", ErrOutsideDirs, path, err)
	}
	return nil, err
}

// openIn opens name beneath dir for reading. The kernel resolves the
// whole path at once (openat2 with RESOLVE_BENEATH), so a directory on the
// way needs only search permission, as for an open by path (a 0711
// directory, which cannot be listed or watched, still serves its files).
// Where openat2 is missing (Linux before 5.6), os.Root resolves it, which
// needs every directory on the way to be readable.
func openIn(dir, name string) (*os.File, error) {
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	fd, err := unix.Openat2(d, name, &unix.OpenHow{
		Flags:   uint64(unix.O_RDONLY | unix.O_CLOEXEC | regularfile.Flags),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	_ = unix.Close(d)
	switch {
	case err == nil:
		return os.NewFile(uintptr(fd), filepath.Join(dir, name)), nil
	case !errors.Is(err, unix.ENOSYS):
		return nil, &os.PathError{Op: "openat2", Path: filepath.Join(dir, name), Err: err}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return root.OpenFile(name, os.O_RDONLY|regularfile.Flags, 0)
}

// within reports whether the clean absolute path p is dir or lies under it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// Run watches the files of every held name until ctx ends, then stops all
// watchers and returns nil. Nothing a client asks for makes it fail: a name
// whose files cannot be loaded is refused, and files whose directory cannot
// be watched are re-read periodically. It may be called once; a second call
// returns ErrRunning.
func (p *Provider) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running || p.stopped {
		p.mu.Unlock()
		return ErrRunning
	}
	p.running, p.ctx = true, ctx
	for _, e := range p.entries {
		p.startLocked(e)
	}
	p.mu.Unlock()

	<-ctx.Done()
	p.mu.Lock()
	p.running, p.stopped, p.ctx = false, true, nil
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// startLocked starts the watcher of e and the goroutine that signals its
// watchers, under the active Run's context; releasing e stops them. p.mu is
// held.
func (p *Provider) startLocked(e *entry) {
	ctx, cancel := context.WithCancel(p.ctx)
	e.stop = cancel
	// Take the value's change channel before the watcher can replace the
	// value, so a change made while the goroutines start is still signalled.
	_, _, changed := e.current()
	p.wg.Go(func() { _ = e.run(ctx) }) // returns nil when ctx ends
	p.wg.Go(func() { e.follow(ctx, changed) })
}

var _ secret.Provider = (*Provider)(nil)

// Secret returns the current secret for name, named exactly name. A name no
// one watches is loaded for this call only and not kept; it is refused, like
// a Watch of it, while MaxResources names are held.
func (p *Provider) Secret(ctx context.Context, name string) (*secret.Secret, error) {
	e, err := p.lookup(name)
	if err != nil {
		return nil, err
	}
	return e.secret(ctx)
}

// Current returns the secret for name as it is now, never waiting for a
// first good value of its files (it loads a name nobody holds, as Secret
// does).
func (p *Provider) Current(name string) (*secret.Secret, error) {
	e, err := p.lookup(name)
	if err != nil {
		return nil, err
	}
	if s, _ := e.now(); s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%s: no good value yet", name)
}

// lookup returns the held entry of name, or loads one for this call only.
func (p *Provider) lookup(name string) (*entry, error) {
	p.mu.Lock()
	e := p.entries[name]
	var err error
	if e == nil {
		err = p.admitLocked()
	}
	p.mu.Unlock()
	if err != nil {
		return nil, refusal(name, err)
	}
	if e == nil {
		var err error
		if e, err = p.newEntry(name); err != nil {
			return nil, refusal(name, err)
		}
	}
	return e, nil
}

// Watch signals changes of name and holds it (its files stay loaded and
// watched) until the returned function is called by every watcher; the
// last release drops the name's watches and memory. For a name that cannot
// be served (its files cannot be loaded, or MaxResources names are held) the
// channel is nil and the name is not held: the caller must refuse it even if
// a later Secret loads it (a slot may have freed meanwhile), since nothing
// would signal its changes.
func (p *Provider) Watch(name string) (<-chan struct{}, func()) {
	e, err := p.hold(name)
	if err != nil {
		p.log.Warn("file resource not served", zap.String(logkeys.Resource, name), zap.Error(err))
		return nil, func() {}
	}
	ch, unsubscribe := e.watch()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			unsubscribe()
			p.release(e)
		})
	}
}

// Held returns the number of names held now.
func (p *Provider) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.entries)
}

func refusal(name string, err error) error {
	return fmt.Errorf("%w: %.200q: %w", secret.ErrUnknownResource, name, err)
}

// hold returns the entry for name with one more reference, creating and
// loading it first if no one holds it.
func (p *Provider) hold(name string) (*entry, error) {
	p.mu.Lock()
	if e, ok := p.entries[name]; ok {
		e.refs++
		p.mu.Unlock()
		return e, nil
	}
	err := p.admitLocked()
	p.mu.Unlock()
	if err != nil {
		return nil, refusal(name, err)
	}
	e, err := p.newEntry(name) // file I/O: outside the lock
	if err != nil {
		return nil, refusal(name, err)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.entries[name]; ok { // held concurrently meanwhile
		old.refs++
		return old, nil
	}
	if err := p.admitLocked(); err != nil {
		return nil, refusal(name, err)
	}
	e.refs = 1
	p.entries[name] = e
	if p.running {
		p.startLocked(e)
	}
	return e, nil
}

// admitLocked says whether one more name may be held. p.mu is held.
func (p *Provider) admitLocked() error {
	if p.stopped {
		return ErrStopped
	}
	if len(p.entries) >= p.cfg.MaxResources {
		return fmt.Errorf("%w: at most %d at once", ErrTooMany, p.cfg.MaxResources)
	}
	return nil
}

// release drops one reference to e; the last stops its watcher and forgets
// it.
func (p *Provider) release(e *entry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e.refs--
	if e.refs > 0 || p.entries[e.name] != e {
		return
	}
	delete(p.entries, e.name)
	if e.stop != nil {
		e.stop()
	}
	p.log.Debug("file resource released", zap.String(logkeys.Resource, e.name))
}

// newEntry parses name, builds its source and loads it once.
func (p *Provider) newEntry(name string) (*entry, error) {
	e := &entry{name: name, version: &p.version, watchers: notify.Set{}}
	switch {
	case strings.HasPrefix(name, secret.FileCertPrefix):
		certPath, keyPath, err := splitPair(strings.TrimPrefix(name, secret.FileCertPrefix))
		if err != nil {
			return nil, err
		}
		if err := errors.Join(p.checkPath(certPath), p.checkPath(keyPath)); err != nil {
			return nil, err
		}
		src, err := certfile.NewPairSource(p.cfg.Files, certPath, keyPath)
		if err != nil {
			return nil, err
		}
		e.bind(src, func(v any) *secret.Secret {
			return v.(*certfile.Pair).Secret(name, sourceName)
		})
	case strings.HasPrefix(name, secret.FileRootPrefix):
		path := strings.TrimPrefix(name, secret.FileRootPrefix)
		if path == "" {
			return nil, errors.New("empty root path")
		}
		if err := p.checkPath(path); err != nil {
			return nil, err
		}
		src, err := certfile.NewRootSource(p.cfg.Files, path)
		if err != nil {
			return nil, err
		}
		e.bind(src, func(v any) *secret.Secret {
			return secret.RootSecret(name, v.(*pki.Bundle), sourceName)
		})
	default:
		return nil, errors.New("not a file resource")
	}
	if _, err := e.reload(); err != nil {
		return nil, err
	}
	return e, nil
}

// splitPair splits "<cert>~<key>"; exactly one "~" and two non-empty paths.
func splitPair(s string) (certPath, keyPath string, err error) {
	if strings.Count(s, "~") != 1 {
		return "", "", errors.New(`want "<cert-path>~<key-path>"`)
	}
	certPath, keyPath, _ = strings.Cut(s, "~")
	if certPath == "" || keyPath == "" {
		return "", "", errors.New(`want "<cert-path>~<key-path>" with both paths`)
	}
	return certPath, keyPath, nil
}

// entry is one name: its source and the secret made from its value.
type entry struct {
	name    string
	version *atomic.Uint64
	refs    int    // watchers holding it; guarded by Provider.mu
	stop    func() // ends its goroutines once started; guarded by Provider.mu

	// Bound to the source's value type by bind.
	run     func(context.Context) error
	reload  func() (bool, error)
	current func() (v any, ok bool, changed <-chan struct{})
	convert func(any) *secret.Secret

	mu       sync.Mutex
	lastV    any
	last     *secret.Secret
	watchers notify.Set
}

func (e *entry) bind(src interface {
	Run(context.Context) error
	Reload() (bool, error)
}, convert func(any) *secret.Secret) {
	e.run, e.reload, e.convert = src.Run, src.Reload, convert
	switch s := src.(type) {
	case *certfile.Source[*certfile.Pair]:
		e.current = func() (any, bool, <-chan struct{}) { return s.Current() }
	case *certfile.Source[*pki.Bundle]:
		e.current = func() (any, bool, <-chan struct{}) { return s.Current() }
	}
}

// secret returns the secret for the current value, waiting for a first
// good value (bounded by ctx).
func (e *entry) secret(ctx context.Context) (*secret.Secret, error) {
	for {
		s, changed := e.now()
		if s != nil {
			return s, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s: %w", e.name, ctx.Err())
		}
	}
}

// now returns the secret for the current value, or nil and the channel that
// signals the next value while the source has no good one.
func (e *entry) now() (*secret.Secret, <-chan struct{}) {
	v, ok, changed := e.current()
	if !ok {
		return nil, changed
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.last == nil || e.lastV != v {
		s := e.convert(v)
		s.Version = e.version.Add(1)
		e.lastV, e.last = v, s
	}
	return e.last, nil
}

func (e *entry) watch() (<-chan struct{}, func()) {
	e.mu.Lock()
	ch := e.watchers.Add()
	e.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			e.mu.Lock()
			e.watchers.Remove(ch)
			e.mu.Unlock()
		})
	}
}

// follow signals the watchers after every change of the source's value.
func (e *entry) follow(ctx context.Context, changed <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		_, _, changed = e.current()
		e.mu.Lock()
		e.watchers.Signal()
		e.mu.Unlock()
	}
}

package outputcerts

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/moby/sys/mountinfo"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/files/atomicfile"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
)

// Config configures a Writer.
type Config struct {
	// Dir is the output directory (OUTPUT_CERTS). A relative path is made
	// absolute against the working directory when New is called. Required.
	Dir string
	// DirMode is the mode given to Dir if the writer has to create it:
	// 0700 or 0750 (to let a group read the certificates; the key stays
	// 0600 unless KeyMode says otherwise). Zero means 0750 with a Group
	// (the directory is then given the group too), else 0700. An existing
	// directory keeps its mode and group; it must be a directory (not a
	// link) owned by root or the agent's uid and writable by neither its
	// group nor others, and so must every directory above it (sticky ones
	// and mount points excepted: see checkParents), or every write is
	// refused.
	DirMode fs.FileMode
	// KeyMode is the mode of key.pem and of the bundle file: 0600, 0640,
	// 0400 or 0440. Never readable by others. Required.
	KeyMode fs.FileMode
	// CertMode is the mode of cert-chain.pem and root-cert.pem: at most
	// 0666. Required.
	CertMode fs.FileMode
	// Group is the group every file is given (a name or a numeric gid),
	// set on the temporary file before it is renamed into place. Empty
	// keeps the agent's group.
	Group string
	// BundleFile, when set, is the name of a single file in Dir holding the
	// private key followed by the certificate chain, as Kubernetes'
	// podCertificate volumes write their credential bundle; written with
	// KeyMode, atomically, with the other files.
	BundleFile string
	// Logger is narrowed with .Named("outputcerts"). Nil means zap.NewNop().
	Logger *zap.Logger
	// Registerer receives meshagent_outputcerts_* metrics. Nil means they are
	// not registered.
	Registerer prometheus.Registerer
}

// Files is what to write. A nil field leaves that file as it is; CertChain
// and Key go together.
type Files struct {
	// CertChain is the PEM chain, leaf first.
	CertChain []byte
	// Key is the PEM private key of the leaf.
	Key []byte
	// Root is the PEM trust bundle.
	Root []byte
	// BundleMap is the SPIFFE trust bundle map (files.BundleMapFile), nil for
	// none.
	BundleMap []byte
}

// Writer writes the output files.
type Writer struct {
	dir      string
	dirMode  fs.FileMode
	keyMode  fs.FileMode
	certMode fs.FileMode
	gid      int // -1: unchanged
	bundle   string
	log      *zap.Logger
	writes   *prometheus.CounterVec
	fails    prometheus.Counter
	mu       sync.Mutex
	swept    bool // the directory's stale temporary files were removed; under mu
	// lastErr is the last Write's failure, nil after a success; guarded
	// by errMu (Healthy never waits for a write in progress).
	errMu   sync.Mutex
	lastErr error
}

// New checks cfg and returns a Writer. It touches nothing on disk; the
// directory is created by the first Write.
func New(cfg Config) (*Writer, error) {
	if cfg.Dir == "" {
		return nil, errors.New("outputcerts: no directory")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("outputcerts: resolving %s: %w", cfg.Dir, err)
	}
	gid, err := LookupGroup(cfg.Group)
	if err != nil {
		return nil, err
	}
	switch cfg.DirMode {
	case 0:
		// A group is given the files so that its members read them: they
		// must be able to enter the directory too.
		cfg.DirMode = 0o700
		if gid >= 0 {
			cfg.DirMode = 0o750
		}
	case 0o700, 0o750:
	default:
		return nil, fmt.Errorf("outputcerts: directory mode %#o not allowed (0700 or 0750)", cfg.DirMode)
	}
	switch cfg.KeyMode {
	case 0o600, 0o640, 0o400, 0o440:
	default:
		return nil, fmt.Errorf("outputcerts: Config.KeyMode %#o not allowed (0600, 0640, 0400 or 0440)", cfg.KeyMode)
	}
	if cfg.CertMode == 0 || cfg.CertMode&^0o666 != 0 {
		return nil, fmt.Errorf("outputcerts: Config.CertMode %#o not allowed (at most 0666, not 0)", cfg.CertMode)
	}
	if b := cfg.BundleFile; b != "" && (b != filepath.Base(b) || b == "." || b == ".." || b == files.KeyFile || b == files.CertChainFile || b == files.RootCertFile) {
		return nil, fmt.Errorf("outputcerts: bundle file %q must be a file name of its own", b)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	w := &Writer{
		dir:      dir,
		dirMode:  cfg.DirMode,
		keyMode:  cfg.KeyMode,
		certMode: cfg.CertMode,
		gid:      gid,
		bundle:   cfg.BundleFile,
		log:      cfg.Logger.Named("outputcerts").With(zap.String(logkeys.Dir, dir)),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_outputcerts_writes_total",
			Help: "Files replaced in the OUTPUT_CERTS directory, by file.",
		}, []string{"file"}),
		fails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshagent_outputcerts_write_failures_total",
			Help: "Writes to the OUTPUT_CERTS directory that failed.",
		}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{w.writes, w.fails} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("outputcerts: registering metrics: %w", err)
			}
		}
	}
	return w, nil
}

// Dir returns the absolute output directory.
func (w *Writer) Dir() string { return w.dir }

// Write replaces the files given in f whose content differs from what is on
// disk: key first, then chain, then roots. The chain and key must parse and
// match, and the roots must parse, or nothing is written. It returns the
// names of the files it replaced.
//
// A failure is counted and logged once per change of its message: a
// directory that stays unwritable is logged once, not at every rotation.
// It is what Healthy reports until a Write succeeds.
func (w *Writer) Write(f Files) ([]string, error) {
	written, err := w.write(f)
	w.errMu.Lock()
	changed := (err == nil) != (w.lastErr == nil) || (err != nil && err.Error() != w.lastErr.Error())
	w.lastErr = err
	w.errMu.Unlock()
	if err != nil {
		w.fails.Inc()
		if changed {
			w.log.Error("writing output certificates failed", zap.Strings(logkeys.Files, written), zap.Error(err))
		}
		return written, err
	}
	if changed {
		w.log.Info("output certificates writable again")
	}
	if len(written) > 0 {
		w.log.Info("output certificates written", zap.Strings(logkeys.Files, written))
	}
	return written, nil
}

// Healthy returns the last Write's failure, naming the directory, or nil
// when it succeeded (or none ran yet): the agent's readiness check.
func (w *Writer) Healthy() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	if w.lastErr != nil {
		return fmt.Errorf("OUTPUT_CERTS %s cannot be written: %w", w.dir, w.lastErr)
	}
	return nil
}

func (w *Writer) write(f Files) ([]string, error) {
	if err := validate(f); err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	dir, err := w.openDir()
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	// Write and sync every changed file first, then rename them back to
	// back, key first: the time in which a reader can see a new key with the
	// old chain is that between two renames.
	type pendingFile struct {
		*atomicfile.Pending
		name string
	}
	var (
		pending   []pendingFile
		committed int
	)
	defer func() {
		for _, p := range pending[committed:] {
			p.Abort()
		}
	}()
	for _, file := range w.files(f) {
		if file.data == nil {
			continue
		}
		same, err := dir.Unchanged(file.name, file.data, file.mode)
		if err != nil {
			return nil, fmt.Errorf("outputcerts: %w", err)
		}
		if same {
			if w.gid >= 0 {
				if err := dir.Lchown(file.name, w.gid); err != nil {
					return nil, fmt.Errorf("outputcerts: %w", err)
				}
			}
			continue
		}
		p, err := dir.Prepare(file.name, file.data, file.mode)
		if err != nil {
			return nil, fmt.Errorf("outputcerts: %w", err)
		}
		pending = append(pending, pendingFile{p, file.name})
		if w.gid >= 0 {
			if err := p.SetGroup(w.gid); err != nil {
				return nil, fmt.Errorf("outputcerts: %w", err)
			}
		}
	}
	var written []string
	for _, p := range pending {
		committed++ // Commit removes the temporary file when it fails
		if err := p.Commit(); err != nil {
			return written, fmt.Errorf("outputcerts: %w", err)
		}
		written = append(written, p.name)
		w.writes.WithLabelValues(p.name).Inc()
	}
	if len(written) > 0 {
		dir.Sync()
	}
	return written, nil
}

// outFile is one file to write.
type outFile struct {
	name string
	data []byte
	mode fs.FileMode
}

// files are f's files in the order they are renamed into place: key
// first, then the chain, the bundle of both, the roots.
func (w *Writer) files(f Files) []outFile {
	out := []outFile{
		{files.KeyFile, f.Key, w.keyMode},
		{files.CertChainFile, f.CertChain, w.certMode},
	}
	if w.bundle != "" && f.Key != nil {
		b := append(append(append([]byte(nil), f.Key...), '\n'), f.CertChain...)
		if bytes.HasSuffix(f.Key, []byte("\n")) {
			b = append(append([]byte(nil), f.Key...), f.CertChain...)
		}
		out = append(out, outFile{w.bundle, b, w.keyMode})
	}
	return append(out, outFile{files.RootCertFile, f.Root, w.certMode}, outFile{files.BundleMapFile, f.BundleMap, w.certMode})
}

// LookupGroup returns the gid of group, a group name or a numeric gid; -1
// for "" (no group set).
func LookupGroup(group string) (int, error) {
	if group == "" {
		return -1, nil
	}
	if gid, err := strconv.Atoi(group); err == nil && gid >= 0 {
		return gid, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("outputcerts: group %q: %w", group, err)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("outputcerts: group %q has gid %q: %w", group, g.Gid, err)
	}
	return gid, nil
}

func validate(f Files) error {
	if (f.CertChain == nil) != (f.Key == nil) {
		return errors.New("outputcerts: certificate chain and key must be written together")
	}
	if f.CertChain != nil {
		chain, err := pki.ParseCertificates(f.CertChain)
		if err != nil {
			return fmt.Errorf("outputcerts: certificate chain: %w", err)
		}
		key, err := pki.ParseKeyPEM(f.Key)
		if err != nil {
			return fmt.Errorf("outputcerts: private key: %w", err)
		}
		if !pki.PublicKeysEqual(key.Public(), chain[0].PublicKey) {
			return fmt.Errorf("outputcerts: %w", pki.ErrKeyMismatch)
		}
	}
	if f.Root != nil {
		if _, err := pki.ParseCertificates(f.Root); err != nil {
			return fmt.Errorf("outputcerts: roots: %w", err)
		}
	}
	return nil
}

// openDir makes the directory if missing and opens it without following a
// link, then checks the open directory (never the path again): a directory
// nobody else controls, owned by root or the agent's uid and writable by
// neither its group nor others, with every directory above it as safe
// (see checkParents): otherwise another user could replace the files, or
// the directory itself, between the agent's writes. Every file of the write
// goes through the handle it returns. The first call also removes the
// temporary files a write cut short left (a ".key.pem.tmp-*" holds a
// private key).
func (w *Writer) openDir() (*atomicfile.Dir, error) {
	d, err := atomicfile.OpenDir(w.dir)
	created := false
	if errors.Is(err, fs.ErrNotExist) {
		// Directories above it are made as mkdir -p makes them: a group given
		// the files must be able to reach them.
		if err := os.MkdirAll(filepath.Dir(w.dir), 0o755); err != nil {
			return nil, fmt.Errorf("outputcerts: creating directory: %w", err)
		}
		if err := os.Mkdir(w.dir, w.dirMode); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("outputcerts: creating directory: %w", err)
		}
		d, err = atomicfile.OpenDir(w.dir)
		created = true
	}
	if err != nil {
		return nil, fmt.Errorf("outputcerts: %w", err)
	}
	if created {
		err = w.setUpDir(d.File())
	}
	if err == nil {
		err = checkDir(d.File())
	}
	if err == nil {
		err = checkParents(d.File())
	}
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	if created {
		w.log.Info("output directory created")
	}
	if !w.swept {
		w.swept = true
		w.removeStaleTemps(d)
	}
	return d, nil
}

// setUpDir gives a directory the writer made its group and exact mode.
func (w *Writer) setUpDir(dir *os.File) error {
	if w.gid >= 0 {
		if err := dir.Chown(-1, w.gid); err != nil {
			return fmt.Errorf("outputcerts: setting the group of %s: %w", w.dir, err)
		}
	}
	// Mkdir's mode is subject to the umask; make it exact.
	if err := dir.Chmod(w.dirMode); err != nil {
		return fmt.Errorf("outputcerts: setting directory mode: %w", err)
	}
	return nil
}

// checkDir refuses an open output directory controlled by another user.
func checkDir(dir *os.File) error {
	fi, err := dir.Stat()
	if err != nil {
		return fmt.Errorf("outputcerts: %w", err)
	}
	return checkDirInfo(dir.Name(), fi)
}

func checkDirInfo(dir string, fi fs.FileInfo) error {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("outputcerts: %s is a symbolic link: name the directory itself", dir)
	case !fi.IsDir():
		return fmt.Errorf("outputcerts: %s is not a directory", dir)
	case fi.Mode().Perm()&0o022 != 0 && !isMountPoint(dir):
		// A volume (a mount point: Kubernetes' emptyDir is 0777, shared only by
		// the pod's containers) is what it is made to be; a directory elsewhere
		// writable by others is not the agent's to trust.
		return fmt.Errorf("outputcerts: %s is writable by its group or others (mode %v): another user could replace the files", dir, fi.Mode().Perm())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("outputcerts: %s is owned by uid %d, neither root nor the agent (uid %d)", dir, st.Uid, os.Geteuid())
	}
	return nil
}

// checkParents walks up from the open directory dir through "..", the
// directories it really is in (not those its path names now), to the root:
// each must be owned by root or the agent's uid, and writable by neither
// its group nor others unless it is sticky (as /tmp: others cannot move
// what they do not own) or a mount point (a volume, as checkDir allows).
// A directory above OUTPUT_CERTS that another user may write lets that
// user rename OUTPUT_CERTS away and put a directory of theirs in its place.
func checkParents(dir *os.File) error {
	path := dir.Name()
	var child unix.Stat_t
	if err := unix.Fstat(int(dir.Fd()), &child); err != nil {
		return fmt.Errorf("outputcerts: %s: %w", path, err)
	}
	fd := int(dir.Fd())
	for depth := 0; depth < 256; depth++ {
		pfd, err := unix.Openat(fd, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if depth > 0 {
			_ = unix.Close(fd)
		}
		if err != nil {
			return fmt.Errorf("outputcerts: opening the directory above %s: %w", path, err)
		}
		fd = pfd
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			_ = unix.Close(fd)
			return fmt.Errorf("outputcerts: the directory above %s: %w", path, err)
		}
		if st.Dev == child.Dev && st.Ino == child.Ino {
			_ = unix.Close(fd) // "/" is its own parent
			return nil
		}
		path = filepath.Dir(path)
		if real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); err == nil {
			path = real
		}
		if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
			_ = unix.Close(fd)
			return fmt.Errorf("outputcerts: %s, above the output directory, is owned by uid %d, neither root nor the agent (uid %d): its owner could replace the directory", path, st.Uid, os.Geteuid())
		}
		if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 && !isMountPoint(path) {
			_ = unix.Close(fd)
			return fmt.Errorf("outputcerts: %s, above the output directory, is writable by its group or others (mode %v) and not sticky: another user could replace the directory", path, fs.FileMode(st.Mode&0o777))
		}
		child = st
	}
	_ = unix.Close(fd)
	return fmt.Errorf("outputcerts: %s is nested too deep", dir.Name())
}

// removeStaleTemps removes the temporary files of the writer's own files
// (atomicfile's ".<name>.tmp-*") that a write cut short left in the
// directory.
func (w *Writer) removeStaleTemps(d *atomicfile.Dir) {
	names := []string{files.KeyFile, files.CertChainFile, files.RootCertFile, files.BundleMapFile}
	if w.bundle != "" {
		names = append(names, w.bundle)
	}
	entries, _ := d.Names()
	for _, entry := range entries {
		for _, name := range names {
			if !strings.HasPrefix(entry, "."+name+".tmp-") {
				continue
			}
			if d.RemoveRegular(entry) {
				w.log.Info("stale temporary file removed", zap.String(logkeys.File, entry))
			}
		}
	}
}

// isMountPoint reports whether dir is the mount point of a file system in
// the agent's mount namespace.
func isMountPoint(dir string) bool {
	m, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(filepath.Clean(dir)))
	return err == nil && len(m) > 0
}

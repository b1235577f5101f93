package outputcerts

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testID = pki.SPIFFEIdentity("cluster.local", "vm", "billing")

type issued struct {
	chain    []*x509.Certificate
	key      crypto.Signer
	chainPEM []byte
	keyPEM   []byte
}

func newCA(t testing.TB) *localca.CA {
	t.Helper()
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t testing.TB, ca *localca.CA, l localca.Leaf) issued {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	l.PublicKey = key.Public()
	if l.Identity.IsZero() {
		l.Identity = testID
	}
	chain, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	chain = chain[:len(chain)-1]
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return issued{chain: chain, key: key, chainPEM: pki.EncodeCertificates(chain), keyPEM: keyPEM}
}

func (i issued) files(ca *localca.CA) Files {
	return Files{CertChain: i.chainPEM, Key: i.keyPEM, Root: ca.RootPEM()}
}

// newWriter makes a Writer of cfg, with the modes internal/app passes by
// default (0600 keys, 0644 certificates) where cfg has none.
func newWriter(t *testing.T, cfg Config) *Writer {
	t.Helper()
	if cfg.KeyMode == 0 {
		cfg.KeyMode = 0o600
	}
	if cfg.CertMode == 0 {
		cfg.CertMode = 0o644
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func mode(t *testing.T, p string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestWriteModes(t *testing.T) {
	ca := newCA(t)
	a := issue(t, ca, localca.Leaf{TTL: time.Hour})
	for _, tt := range []struct {
		name    string
		dirMode fs.FileMode
		want    fs.FileMode
	}{
		{"default", 0, 0o700},
		{"group readable", 0o750, 0o750},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "var", "lib", "meshagent")
			w := newWriter(t, Config{Dir: dir, DirMode: tt.dirMode})
			written, err := w.Write(a.files(ca))
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{files.KeyFile, files.CertChainFile, files.RootCertFile}; !slices.Equal(written, want) {
				t.Fatalf("written %v, want %v (key first)", written, want)
			}
			if got := mode(t, dir); got != tt.want {
				t.Errorf("directory mode %#o, want %#o", got, tt.want)
			}
			for name, want := range map[string]fs.FileMode{files.KeyFile: 0o600, files.CertChainFile: 0o644, files.RootCertFile: 0o644} {
				if got := mode(t, filepath.Join(dir, name)); got != want {
					t.Errorf("%s mode %#o, want %#o", name, got, want)
				}
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 3 {
				t.Errorf("directory holds %d entries, want the 3 files", len(entries))
			}
		})
	}

	// An existing directory keeps its mode.
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := newWriter(t, Config{Dir: dir}).Write(a.files(ca)); err != nil {
		t.Fatal(err)
	}
	if got := mode(t, dir); got != 0o755 {
		t.Fatalf("existing directory mode changed to %#o", got)
	}
}

func TestWriteOnlyWhenChanged(t *testing.T) {
	ca := newCA(t)
	a := issue(t, ca, localca.Leaf{TTL: time.Hour})
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	w := newWriter(t, Config{Dir: dir, Registerer: reg})
	if _, err := w.Write(a.files(ca)); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	stamp := func() {
		for _, n := range []string{files.KeyFile, files.CertChainFile, files.RootCertFile} {
			if err := os.Chtimes(filepath.Join(dir, n), old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	unchanged := func(names ...string) {
		t.Helper()
		for _, n := range names {
			fi, err := os.Stat(filepath.Join(dir, n))
			if err != nil {
				t.Fatal(err)
			}
			if !fi.ModTime().Equal(old) {
				t.Errorf("%s was rewritten", n)
			}
		}
	}
	stamp()
	written, err := w.Write(a.files(ca))
	if err != nil || len(written) != 0 {
		t.Fatalf("same content: written %v, %v", written, err)
	}
	unchanged(files.KeyFile, files.CertChainFile, files.RootCertFile)

	// A root change rewrites only the root file.
	other := newCA(t)
	written, err = w.Write(Files{Root: append(ca.RootPEM(), other.RootPEM()...)})
	if err != nil || !slices.Equal(written, []string{files.RootCertFile}) {
		t.Fatalf("root change: written %v, %v", written, err)
	}
	unchanged(files.KeyFile, files.CertChainFile)

	// A rotation rewrites key and chain.
	stamp()
	b := issue(t, ca, localca.Leaf{TTL: time.Hour})
	written, err = w.Write(Files{CertChain: b.chainPEM, Key: b.keyPEM})
	if err != nil || !slices.Equal(written, []string{files.KeyFile, files.CertChainFile}) {
		t.Fatalf("rotation: written %v, %v", written, err)
	}
	unchanged(files.RootCertFile)

	// Someone loosened the key's mode: fixed without rewriting it.
	stamp()
	if err := os.Chmod(filepath.Join(dir, files.KeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if written, err := w.Write(Files{CertChain: b.chainPEM, Key: b.keyPEM}); err != nil || len(written) != 0 {
		t.Fatalf("mode fix: written %v, %v", written, err)
	}
	if got := mode(t, filepath.Join(dir, files.KeyFile)); got != 0o600 {
		t.Fatalf("key mode %#o not corrected", got)
	}
	unchanged(files.KeyFile)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var writes float64
	for _, mf := range mfs {
		if mf.GetName() == "meshagent_outputcerts_writes_total" {
			for _, m := range mf.GetMetric() {
				writes += m.GetCounter().GetValue()
			}
		}
	}
	if writes != 6 {
		t.Fatalf("writes counted %v, want 6", writes)
	}
}

func TestWriteRejectsBadInput(t *testing.T) {
	ca := newCA(t)
	a, b := issue(t, ca, localca.Leaf{TTL: time.Hour}), issue(t, ca, localca.Leaf{TTL: time.Hour})
	dir := t.TempDir()
	w := newWriter(t, Config{Dir: dir})
	if _, err := w.Write(a.files(ca)); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]Files{
		"mismatched pair": {CertChain: a.chainPEM, Key: b.keyPEM},
		"chain only":      {CertChain: b.chainPEM},
		"key only":        {Key: b.keyPEM},
		"truncated chain": {CertChain: b.chainPEM[:100], Key: b.keyPEM},
		"truncated key":   {CertChain: b.chainPEM, Key: b.keyPEM[:40]},
		"bad roots":       {CertChain: b.chainPEM, Key: b.keyPEM, Root: []byte("nope")},
	} {
		if written, err := w.Write(f); err == nil || len(written) != 0 {
			t.Errorf("%s: written %v, %v", name, written, err)
		}
	}
	p, err := Load(dir, testID, time.Now())
	if err != nil || !p.Leaf().Equal(a.chain[0]) {
		t.Fatalf("the files on disk changed: %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no dir":   {},
		"dir mode": {Dir: "x", DirMode: 0o777},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w := newWriter(t, Config{Dir: file})
	ca := newCA(t)
	if _, err := w.Write(Files{Root: ca.RootPEM()}); err == nil {
		t.Fatal("wrote into a path that is a file")
	}
	reg := prometheus.NewRegistry()
	newWriter(t, Config{Dir: "a", Registerer: reg})
	if _, err := New(Config{Dir: "b", Registerer: reg}); err == nil {
		t.Fatal("second writer registered the same metrics")
	}
}

// A reader racing the writer never sees a half-written file, and Load always
// returns a matching pair (old or new). Raw reads of the two files may pair a
// new key with the old chain for the moment between the renames; the test
// counts how often, which is why Load re-reads.
func TestConcurrentReaderSeesConsistentFiles(t *testing.T) {
	ca := newCA(t)
	pairs := make([]issued, 4)
	for i := range pairs {
		pairs[i] = issue(t, ca, localca.Leaf{TTL: time.Hour})
	}
	dir := t.TempDir()
	w := newWriter(t, Config{Dir: dir})
	if _, err := w.Write(pairs[0].files(ca)); err != nil {
		t.Fatal(err)
	}

	var (
		wg         sync.WaitGroup
		done       atomic.Bool
		reads      atomic.Int64
		rawSkewed  atomic.Int64
		loadSkewed atomic.Int64
		firstError atomic.Pointer[error]
	)
	fail := func(err error) { firstError.CompareAndSwap(nil, &err) }
	for range 2 {
		wg.Go(func() {
			for !done.Load() {
				chainPEM, err1 := os.ReadFile(filepath.Join(dir, files.CertChainFile))
				keyPEM, err2 := os.ReadFile(filepath.Join(dir, files.KeyFile))
				if err := errors.Join(err1, err2); err != nil {
					fail(err)
					return
				}
				// Each file on its own is always complete.
				if _, err := pki.ParseCertificates(chainPEM); err != nil {
					fail(err)
					return
				}
				if _, err := pki.ParseKeyPEM(keyPEM); err != nil {
					fail(err)
					return
				}
				if _, err := certfile.ParsePair(chainPEM, keyPEM, time.Now()); errors.Is(err, pki.ErrKeyMismatch) {
					rawSkewed.Add(1)
				}
				// Load retries a mismatched pair for a while; a writer
				// descheduled between its two renames for longer can still
				// outlast it, and then the only right answer is the error.
				// Anything else, or a pair that is not one, is a failure.
				p, err := Load(dir, testID, time.Now())
				switch {
				case errors.Is(err, pki.ErrKeyMismatch):
					loadSkewed.Add(1)
					continue
				case err != nil:
					fail(err)
					return
				}
				if _, err := certfile.ParsePair(p.ChainPEM, p.KeyPEM, time.Now()); err != nil {
					fail(fmt.Errorf("Load returned a pair that is not one: %w", err))
					return
				}
				reads.Add(1)
			}
		})
	}
	// Far more often than any rotation, but with gaps, as real writes
	// have: Load's re-reads wait for one write, not for a writer that
	// never stops.
	for i := range 200 {
		if _, err := w.Write(pairs[i%len(pairs)].files(ca)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	done.Store(true)
	wg.Wait()
	if err := firstError.Load(); err != nil {
		t.Fatal(*err)
	}
	t.Logf("%d consistent loads, %d refused as mismatched; %d raw reads caught between the key and chain renames",
		reads.Load(), loadSkewed.Load(), rawSkewed.Load())
	if reads.Load() == 0 {
		t.Fatal("the readers never ran")
	}
}

func TestRelativeDir(t *testing.T) {
	w := newWriter(t, Config{Dir: "etc/certs"})
	wd, _ := os.Getwd()
	if w.Dir() != filepath.Join(wd, "etc/certs") {
		t.Fatalf("Dir %s", w.Dir())
	}
}

// File modes, an owning group and the single-file bundle (key, then chain)
// are settings; the bundle is replaced atomically with the pair.
func TestWriterModesGroupAndBundle(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the test gives files another group, which needs root (the tests run as root here)")
	}
	ca := newCA(t)
	dir := filepath.Join(t.TempDir(), "out")
	w := newWriter(t, Config{Dir: dir, KeyMode: 0o640, CertMode: 0o640, Group: "1", BundleFile: "credential-bundle.pem"})
	a := issue(t, ca, localca.Leaf{})
	written, err := w.Write(a.files(ca))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{files.KeyFile, files.CertChainFile, "credential-bundle.pem", files.RootCertFile}; !slices.Equal(written, want) {
		t.Fatalf("written %v, want %v", written, want)
	}
	for name, mode := range map[string]os.FileMode{files.KeyFile: 0o640, files.CertChainFile: 0o640, files.RootCertFile: 0o640, "credential-bundle.pem": 0o640} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != mode || fi.Sys().(*syscall.Stat_t).Gid != 1 {
			t.Errorf("%s: mode %v gid %d, want %v gid 1", name, fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Gid, mode)
		}
	}
	bundle, err := os.ReadFile(filepath.Join(dir, "credential-bundle.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bundle, append(append([]byte{}, a.keyPEM...), a.chainPEM...)) {
		t.Errorf("bundle is not the key then the chain:\n%s", bundle)
	}
	// Only the roots changed: the bundle stays.
	ino := inode(t, filepath.Join(dir, "credential-bundle.pem"))
	if written, err := w.Write(Files{Root: newCA(t).RootPEM()}); err != nil || !slices.Equal(written, []string{files.RootCertFile}) {
		t.Fatalf("root change wrote %v, %v", written, err)
	}
	if inode(t, filepath.Join(dir, "credential-bundle.pem")) != ino {
		t.Error("a root change rewrote the bundle")
	}
}

func TestWriterRefusesBadModesGroupsAndBundleNames(t *testing.T) {
	good := Config{KeyMode: 0o600, CertMode: 0o644}
	for name, edit := range map[string]func(*Config){
		"key readable by others": func(c *Config) { c.KeyMode = 0o644 },
		"no key mode":            func(c *Config) { c.KeyMode = 0 },
		"cert executable":        func(c *Config) { c.CertMode = 0o755 },
		"no cert mode":           func(c *Config) { c.CertMode = 0 },
		"unknown group":          func(c *Config) { c.Group = "no-such-group-here" },
		"bundle over the key":    func(c *Config) { c.BundleFile = files.KeyFile },
		"bundle in a directory":  func(c *Config) { c.BundleFile = "sub/bundle.pem" },
	} {
		cfg := good
		cfg.Dir = t.TempDir()
		if _, err := New(cfg); err != nil {
			t.Fatalf("the good configuration: %v", err)
		}
		edit(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// An existing OUTPUT_CERTS directory is checked, once opened, before anything
// is written into it: another user's, one others may write, or a link is
// refused, and nothing is written.
func TestWriterRefusesADirectoryOthersControl(t *testing.T) {
	ca := newCA(t)
	f := issue(t, ca, localca.Leaf{}).files(ca)
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns OUTPUT_CERTS
		want  string
	}{
		{"another user's", func(t *testing.T, dir string) string {
			if os.Geteuid() != 0 {
				t.Skip("chown needs root")
			}
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return dir
		}, "owned by uid 65534"},
		{"world-writable", func(t *testing.T, dir string) string {
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			return dir
		}, "writable by its group or others"},
		{"group-writable", func(t *testing.T, dir string) string {
			if err := os.Chmod(dir, 0o770); err != nil {
				t.Fatal(err)
			}
			return dir
		}, "writable by its group or others"},
		{"a symbolic link", func(t *testing.T, dir string) string {
			link := filepath.Join(t.TempDir(), "certs")
			if err := os.Symlink(dir, link); err != nil {
				t.Fatal(err)
			}
			return link
		}, "symbolic link"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "out")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			out := tt.setup(t, dir)
			_, err := newWriter(t, Config{Dir: out}).Write(f)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Write: %v, want a refusal saying %q", err, tt.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("files written into the refused directory: %v", entries)
			}
		})
	}
}

// The temporary files a write cut short left (a ".key.pem.tmp-*" holds a
// private key) are removed by the first write; other files are left alone.
func TestWriterRemovesStaleTemporaryFiles(t *testing.T) {
	ca := newCA(t)
	dir := filepath.Join(t.TempDir(), "out")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	stale := []string{".key.pem.tmp-123456", ".cert-chain.pem.tmp-9", ".root-cert.pem.tmp-77"}
	for _, n := range append(stale, "app.conf", ".other.tmp-1") {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := newWriter(t, Config{Dir: dir}).Write(issue(t, ca, localca.Leaf{}).files(ca)); err != nil {
		t.Fatal(err)
	}
	for _, n := range stale {
		if _, err := os.Lstat(filepath.Join(dir, n)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left: %v", n, err)
		}
	}
	for _, n := range []string{"app.conf", ".other.tmp-1", "key.pem"} {
		if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}

// A file of the directory replaced by a symbolic link is replaced, never
// followed: its target is neither read as "unchanged" nor chmod-ed.
func TestWriterDoesNotFollowLinks(t *testing.T) {
	ca := newCA(t)
	dir := filepath.Join(t.TempDir(), "out")
	f := issue(t, ca, localca.Leaf{}).files(ca)
	w := newWriter(t, Config{Dir: dir})
	if _, err := w.Write(f); err != nil {
		t.Fatal(err)
	}
	// Someone swaps root-cert.pem for a link to a file of theirs with the
	// same content and another mode.
	target := filepath.Join(t.TempDir(), "theirs")
	if err := os.WriteFile(target, f.Root, 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root-cert.pem")
	if err := os.Remove(root); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, root); err != nil {
		t.Fatal(err)
	}
	written, err := w.Write(f)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(written, "root-cert.pem") {
		t.Errorf("written %v: the link was taken for the unchanged file", written)
	}
	if fi, err := os.Lstat(root); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("root-cert.pem is %v (%v), want a regular file again", fi.Mode(), err)
	}
	if m := mode(t, target); m != 0o600 {
		t.Errorf("the link's target was chmod-ed to %v", m)
	}
}

// TestMountedVolumeMayBeShared: a directory writable by others is accepted
// when it is a mount point (a volume: Kubernetes' emptyDir is 0777), refused
// elsewhere.
func TestMountedVolumeMayBeShared(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "volume")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Lstat(dir)
	if err := checkDirInfo(dir, fi); err == nil {
		t.Fatal("a world-writable directory that is no mount point was accepted")
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "mode=0777"); err != nil {
		t.Skipf("mount: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	fi, _ = os.Lstat(dir)
	if err := checkDirInfo(dir, fi); err != nil {
		t.Fatalf("a world-writable volume (mount point): %v", err)
	}
}

// A directory above OUTPUT_CERTS that another user may write (not sticky,
// no mount point) lets that user move the output directory away and put one
// of theirs in its place between two writes: refused, whatever the depth;
// a sticky one (as /tmp) is not, since others cannot move what they do not
// own.
func TestWriterRefusesParentsOthersMayWrite(t *testing.T) {
	ca := newCA(t)
	f := issue(t, ca, localca.Leaf{}).files(ca)
	for name, tc := range map[string]struct {
		mode fs.FileMode // of the directory two levels above
		up   string      // which one gets it
		want string      // "" for accepted
	}{
		"parent world-writable":      {0o777, "parent", "writable by its group or others"},
		"grandparent group-writable": {0o775, "grandparent", "writable by its group or others"},
		"parent sticky":              {0o777 | fs.ModeSticky, "parent", ""},
	} {
		t.Run(name, func(t *testing.T) {
			grand := filepath.Join(t.TempDir(), "grand")
			parent := filepath.Join(grand, "parent")
			dir := filepath.Join(parent, "out")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			target := parent
			if tc.up == "grandparent" {
				target = grand
			}
			if err := os.Chmod(target, tc.mode); err != nil {
				t.Fatal(err)
			}
			_, err := newWriter(t, Config{Dir: dir}).Write(f)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Write: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), target) {
				t.Fatalf("Write: %v, want a refusal naming %s and saying %q", err, target, tc.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("files written under the refused parent: %v", entries)
			}
		})
	}
}

// The files of one write go into the directory that was checked: one
// replaced by another after the writer opened it (a rename in the parent)
// gets nothing of that write.
func TestWriterWritesThroughTheDirectoryItChecked(t *testing.T) {
	ca := newCA(t)
	f := issue(t, ca, localca.Leaf{}).files(ca)
	parent := t.TempDir()
	dir := filepath.Join(parent, "out")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	w := newWriter(t, Config{Dir: dir})
	d, err := w.openDir()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// Between the check and the files, the directory is moved and another
	// takes its name.
	if err := os.Rename(dir, filepath.Join(parent, "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p, err := d.Prepare("key.pem", f.Key, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the directory put in place got %v", entries)
	}
	if b, err := os.ReadFile(filepath.Join(parent, "moved", "key.pem")); err != nil || !bytes.Equal(b, f.Key) {
		t.Errorf("the checked directory's key.pem: %v", err)
	}
}

package test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/files/filewatch"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// nobody is the unprivileged user the agent runs as where a test needs the
// kernel to refuse it something.
const nobody = 65534

// frMountedCerts lays out etc/certs under dir for FILE_MOUNTED_CERTS=true
// and returns the chain served as "default".
func frMountedCerts(t *testing.T, dir string) []byte {
	t.Helper()
	ca := flCA(t)
	certs := filepath.Join(dir, "etc/certs")
	chain, key := flIssue(t, ca, flID, time.Hour)
	flWrite(t, filepath.Join(certs, "cert-chain.pem"), chain)
	flWrite(t, filepath.Join(certs, "key.pem"), key)
	flWrite(t, filepath.Join(certs, "root-cert.pem"), ca.RootPEM())
	return chain
}

// frWriteRoot writes a root bundle readable by everyone, through a rename.
func frWriteRoot(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// frWaitRoot waits up to within for a response in which name carries want.
func frWaitRoot(t *testing.T, s *sdsclient.Stream, within time.Duration, name string, want []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		r, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("%s did not carry the expected roots within %v: %v", name, within, err)
		}
		if got, ok := r.TrustedCA(name); ok && bytes.Equal(got, want) {
			return
		}
	}
}

func chownAll(t *testing.T, root string, uid int) {
	t.Helper()
	err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A file-root: resource in a directory the agent may read files from but
// not list (mode 0711, the agent not its owner) cannot be watched. The
// agent must not stop: it serves the resource by re-reading it
// periodically (logged), follows changes of it that way, and every other
// resource is unaffected, including a file-root: in a directory it can
// watch, which still follows changes by events.
func TestFileRootInUnwatchableDirectoryIsPolled(t *testing.T) {
	dir := agentproc.TempDir(t)
	chain := frMountedCerts(t, dir)
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	chownAll(t, dir, nobody)
	// Owned by root, listable by root only; its files readable by all.
	locked := filepath.Join(dir, "locked")
	if err := os.Mkdir(locked, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(locked, 0o711); err != nil { // whatever the umask
		t.Fatal(err)
	}
	lockedRoot, openRoot := filepath.Join(locked, "root.pem"), filepath.Join(open, "root.pem")
	ca1, ca2, ca3 := flCA(t), flCA(t), flCA(t)
	frWriteRoot(t, lockedRoot, ca1.RootPEM())
	frWriteRoot(t, openRoot, ca1.RootPEM())

	p := agentproc.StartAs(t, &syscall.Credential{Uid: nobody, Gid: nobody}, dir, flEnv("FILE_MOUNTED_CERTS=true")...)
	lockedName := secretmanager.FileRootPrefix + lockedRoot
	openName := secretmanager.FileRootPrefix + openRoot
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName, lockedName, openName)
	flWaitCert(t, s, 15*time.Second, chain, secretmanager.WorkloadCertName)

	frWriteRoot(t, lockedRoot, ca2.RootPEM())
	frWaitRoot(t, s, filewatch.DefaultPollInterval+flDebounce+2*time.Second, lockedName, ca2.RootPEM())
	frWriteRoot(t, openRoot, ca3.RootPEM())
	frWaitRoot(t, s, flDebounce+time.Second, openName, ca3.RootPEM())
	frWriteRoot(t, lockedRoot, ca3.RootPEM())
	frWaitRoot(t, s, filewatch.DefaultPollInterval+flDebounce+2*time.Second, lockedName, ca3.RootPEM())

	if code := p.ExitCode(); code != -1 {
		t.Fatalf("the agent exited with %d", code)
	}
	if !strings.Contains(p.Logs(), "directory cannot be watched") {
		t.Error("the unwatchable directory was not logged")
	}
	// A second stream on the same name is served too.
	s2 := flStream(t, p.Socket(), lockedName)
	frWaitRoot(t, s2, 5*time.Second, lockedName, ca3.RootPEM())
}

// inotifyInstances counts the inotify instances a process holds.
func inotifyInstances(t *testing.T, pid int) int {
	t.Helper()
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join(fdDir, e.Name())); err == nil && target == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// Many file resources, each in a directory of its own, plus the mounted
// certificates: the agent holds one inotify instance (max_user_instances
// is 128 per user on the whole node), and every resource still follows
// its file.
func TestFileResourcesShareOneInotifyInstance(t *testing.T) {
	dir := agentproc.TempDir(t)
	chain := frMountedCerts(t, dir)
	ca := flCA(t)
	const n = 40
	names := []string{secretmanager.WorkloadCertName}
	paths := make([]string, n)
	for i := range n {
		paths[i] = filepath.Join(dir, fmt.Sprintf("roots%d", i), "root.pem")
		flWrite(t, paths[i], ca.RootPEM())
		names = append(names, secretmanager.FileRootPrefix+paths[i])
	}
	// One caller holds them all: lift its share to the whole table.
	p := agentproc.Start(t, dir, flEnv("FILE_MOUNTED_CERTS=true", "MESHAGENT_SDS_MAX_FILE_RESOURCES_PER_CALLER=64")...)
	s := flStream(t, p.Socket(), names...)
	flWaitCert(t, s, 15*time.Second, chain, secretmanager.WorkloadCertName)
	if got := inotifyInstances(t, p.Pid()); got != 1 {
		t.Errorf("the agent holds %d inotify instances for %d watched sources, want 1", got, n+2)
	}
	ca2 := flCA(t)
	flRename(t, paths[n-1], ca2.RootPEM())
	frWaitRoot(t, s, flDebounce+time.Second, names[n], ca2.RootPEM())
}

// The directory of a file-root: resource deleted and made again, the way
// `rm -rf certs; mkdir certs; cp ...` does, faster than the debounce: the
// new content is pushed, and so is every later change.
func TestFileRootDirectoryDeletedAndMadeAgain(t *testing.T) {
	dir := agentproc.TempDir(t)
	chain := frMountedCerts(t, dir)
	certs := filepath.Join(dir, "roots")
	path := filepath.Join(certs, "root.pem")
	flWrite(t, path, flCA(t).RootPEM())
	p := agentproc.Start(t, dir, flEnv("FILE_MOUNTED_CERTS=true")...)
	name := secretmanager.FileRootPrefix + path
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName, name)
	flWaitCert(t, s, 15*time.Second, chain, secretmanager.WorkloadCertName)

	for round := range 3 {
		next := flCA(t).RootPEM()
		if err := os.RemoveAll(certs); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(certs, 0o755); err != nil {
			t.Fatal(err)
		}
		flWrite(t, path, next)
		frWaitRoot(t, s, flDebounce+time.Second, name, next)

		later := flCA(t).RootPEM()
		flRename(t, path, later)
		t.Logf("round %d: re-created directory served, now a later change", round)
		frWaitRoot(t, s, flDebounce+time.Second, name, later)
	}
}

// File resources are released when no stream holds them: 100 distinct
// names asked for one after another are all served (the limit of 64 is on
// names held at once); with 64 held, a 65th is refused, and served once
// the stream holding the others ends. The one caller here is not bounded
// below the table (MESHAGENT_SDS_MAX_FILE_RESOURCES_PER_CALLER=65); by
// default it holds at most 16 (TestFileResourcesCallerShare).
func TestFileResourceNamesReleased(t *testing.T) {
	dir := agentproc.TempDir(t)
	chain := frMountedCerts(t, dir)
	ca := flCA(t)
	const total = 100
	names := make([]string, total)
	for i := range total {
		path := filepath.Join(dir, "roots", fmt.Sprintf("r%03d.pem", i))
		flWrite(t, path, ca.RootPEM())
		names[i] = secretmanager.FileRootPrefix + path
	}
	p := agentproc.Start(t, dir, flEnv("FILE_MOUNTED_CERTS=true", "MESHAGENT_SDS_MAX_FILE_RESOURCES_PER_CALLER=65")...)
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName)
	flWaitCert(t, s, 15*time.Second, chain, secretmanager.WorkloadCertName)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	open := func(names ...string) (*sdsclient.Stream, error) {
		st, err := c.Stream(ctx, sdsclient.StreamConfig{Names: names})
		if err != nil {
			return nil, err
		}
		if _, err := st.Next(ctx); err != nil {
			st.Close()
			return nil, err
		}
		return st, nil
	}
	for i, name := range names {
		st, err := open(name)
		if err != nil {
			t.Fatalf("name %d of %d asked for one after another: %v", i+1, total, err)
		}
		st.Close()
	}

	// 64 held at once by one stream (the server may still be releasing
	// the last names above: retry briefly).
	var held *sdsclient.Stream
	testwait.Within(t, 5*time.Second, "a stream holding 64 names at once", func() bool {
		held, err = open(names[:64]...)
		return err == nil
	})
	if _, err := open(names[64]); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a 65th name while 64 are held: %v, want InvalidArgument", err)
	}
	held.Close()
	testwait.Within(t, 5*time.Second, "the 65th name after the 64 were released", func() bool {
		st, err := open(names[64])
		if err != nil {
			return false
		}
		st.Close()
		return true
	})
	if code := p.ExitCode(); code != -1 {
		t.Fatalf("the agent exited with %d", code)
	}
}

// By default one caller holds at most 16 file resources at once: the 17th
// is refused with ResourceExhausted naming it and the limit, and the agent
// serves on.
func TestFileResourcesCallerShare(t *testing.T) {
	dir := agentproc.TempDir(t)
	frMountedCerts(t, dir)
	ca := flCA(t)
	names := make([]string, 17)
	for i := range names {
		path := filepath.Join(dir, "roots", fmt.Sprintf("r%02d.pem", i))
		flWrite(t, path, ca.RootPEM())
		names[i] = secretmanager.FileRootPrefix + path
	}
	p := agentproc.Start(t, dir, flEnv("FILE_MOUNTED_CERTS=true")...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	held, err := c.Stream(ctx, sdsclient.StreamConfig{Names: names[:16]})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := held.Next(ctx); err != nil {
		t.Fatalf("16 file resources: %v", err)
	}
	over, err := c.Stream(ctx, sdsclient.StreamConfig{Names: names[16:]})
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	_, err = over.Next(ctx)
	if st := status.Convert(over.Err()); st.Code() != codes.ResourceExhausted ||
		!strings.Contains(st.Message(), names[16]) || !strings.Contains(st.Message(), "at most 16") {
		t.Fatalf("the 17th file resource: %v (%v), want ResourceExhausted naming it and the limit", over.Err(), err)
	}
	if code := p.ExitCode(); code != -1 {
		t.Fatalf("the agent exited with %d", code)
	}
}

// File resources that are not regular files: a device that never ends, a
// FIFO nobody writes, a directory. Each is refused at once with
// InvalidArgument; the agent neither hangs on it nor reads without end,
// and keeps serving.
func TestFileResourcesThatAreNotRegularFiles(t *testing.T) {
	dir := agentproc.TempDir(t)
	chain := frMountedCerts(t, dir)
	fifo := filepath.Join(dir, "fifo.pem")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	p := agentproc.Start(t, dir, flEnv("FILE_MOUNTED_CERTS=true")...)
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName)
	flWaitCert(t, s, 15*time.Second, chain, secretmanager.WorkloadCertName)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, name := range []string{
		secretmanager.FileRootPrefix + "/dev/zero",
		secretmanager.FileRootPrefix + fifo,
		secretmanager.FileCertPrefix + fifo + "~" + fifo,
		secretmanager.FileRootPrefix + dir,
	} {
		fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Fetch(fctx, name)
		fcancel()
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%q: %v, want InvalidArgument at once", name, err)
		}
		st, err := c.Stream(ctx, sdsclient.StreamConfig{Names: []string{name}})
		if err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = st.Next(sctx)
		scancel()
		st.Close()
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("stream of %q: %v, want InvalidArgument at once", name, err)
		}
	}
	if code := p.ExitCode(); code != -1 {
		t.Fatalf("the agent exited with %d", code)
	}
	r, err := c.Fetch(ctx, secretmanager.WorkloadCertName)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := r.Cert(secretmanager.WorkloadCertName); !bytes.Equal(got, chain) {
		t.Fatal("default no longer served")
	}
}

// The socket's callers choose the paths of file-cert: and file-root:. With
// the default MESHAGENT_FILE_RESOURCE_DIRS, the built agent (root, so it can
// read any file) serves files under Istio's directories and refuses a key
// elsewhere, as named, through ".." or through a symbolic link out of an
// allowed directory; with MESHAGENT_SDS_ALLOWED_UIDS set, the operator trusts
// the callers and any path is served.
func TestFileResourcesOnlyUnderAllowedDirs(t *testing.T) {
	ca := flCA(t)
	dir := agentproc.TempDir(t)
	chain := frMountedCerts(t, dir)
	secret := filepath.Join(dir, "secret")
	otherChain, otherKey := flIssue(t, ca, pki.SPIFFEIdentity("cluster.local", "root", "only"), time.Hour)
	flWrite(t, filepath.Join(secret, "cert.pem"), otherChain)
	flWrite(t, filepath.Join(secret, "key.pem"), otherKey)
	if err := os.Chmod(filepath.Join(secret, "key.pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(secret, "key.pem"), filepath.Join(dir, "etc/certs/leak.pem")); err != nil {
		t.Fatal(err)
	}
	inside := secretmanager.FileCertPrefix + "./etc/certs/cert-chain.pem~./etc/certs/key.pem"
	outside := secretmanager.FileCertPrefix + filepath.Join(secret, "cert.pem") + "~" + filepath.Join(secret, "key.pem")
	viaLink := secretmanager.FileCertPrefix + filepath.Join(secret, "cert.pem") + "~" + filepath.Join(dir, "etc/certs/leak.pem")
	dotdot := secretmanager.FileRootPrefix + "./etc/certs/../secret/cert.pem"

	env := func(extra ...string) []string {
		var out []string
		for _, e := range flEnv(extra...) {
			if !strings.HasPrefix(e, "MESHAGENT_FILE_RESOURCE_DIRS=") {
				out = append(out, e)
			}
		}
		return out
	}
	fetch := func(t *testing.T, sock, name string) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := sdsclient.Dial(ctx, sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Fetch(ctx, name)
		return err
	}

	t.Run("default directories", func(t *testing.T) {
		p := agentproc.Start(t, dir, env("FILE_MOUNTED_CERTS=true")...)
		s := flStream(t, p.Socket(), secretmanager.WorkloadCertName)
		flWaitCert(t, s, 15*time.Second, chain, secretmanager.WorkloadCertName)
		if err := fetch(t, p.Socket(), inside); err != nil {
			t.Errorf("a file-cert: under ./etc/certs: %v", err)
		}
		for _, name := range []string{outside, viaLink, dotdot} {
			if err := fetch(t, p.Socket(), name); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "outside the directories") {
				t.Errorf("%s: %v, want InvalidArgument naming the allowed directories", name, err)
			}
		}
	})
	t.Run("trusted uids", func(t *testing.T) {
		p := agentproc.Start(t, dir, env("FILE_MOUNTED_CERTS=true", fmt.Sprintf("MESHAGENT_SDS_ALLOWED_UIDS=%d", os.Geteuid()))...)
		s := flStream(t, p.Socket(), secretmanager.WorkloadCertName)
		flWaitCert(t, s, 15*time.Second, chain, secretmanager.WorkloadCertName)
		if err := fetch(t, p.Socket(), outside); err != nil {
			t.Errorf("with MESHAGENT_SDS_ALLOWED_UIDS: %v, want the file served", err)
		}
	})
}

package test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/files/filewatch"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/agentproc"
)

// inotifyHogEnv makes the test binary, started again as a child, take every
// inotify instance its user may have and hold them until its stdin closes.
const inotifyHogEnv = "MESHAGENT_TEST_INOTIFY_HOG"

func hogInotify() int {
	n := 0
	for ; n < 1<<16; n++ {
		if _, err := syscall.InotifyInit1(syscall.IN_CLOEXEC); err != nil {
			fmt.Printf("held %d (%v)\n", n, err)
			break
		}
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// startInotifyHog runs a copy of the test binary as uid until the returned
// function is called; it holds every inotify instance uid may open
// (fs.inotify.max_user_instances is per user).
func startInotifyHog(t *testing.T, uid int) (stop func()) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := agentproc.TempDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "hog")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{inotifyHogEnv + "=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "held ") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("inotify hog: %q, %v", line, err)
	}
	t.Logf("inotify hog as uid %d: %s", uid, strings.TrimSpace(line))
	done := false
	stop = func() {
		if done {
			return
		}
		done = true
		_ = stdin.Close()
		_ = cmd.Wait()
	}
	t.Cleanup(stop)
	return stop
}

// With every inotify instance of its user taken (another process of the
// same user holds max_user_instances of them), the agent cannot open its
// one watcher. It starts and serves anyway, re-reading its files
// periodically (logged), and follows changes that way; once instances are
// free again it watches, with a single instance.
func TestNoInotifyInstanceLeftFallsBackToPolling(t *testing.T) {
	stopHog := startInotifyHog(t, nobody)
	dir := agentproc.TempDir(t)
	chain := frMountedCerts(t, dir)
	rootsDir := filepath.Join(dir, "roots")
	if err := os.Mkdir(rootsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(rootsDir, "root.pem")
	frWriteRoot(t, path, flCA(t).RootPEM())
	chownAll(t, dir, nobody)

	p := agentproc.StartAs(t, &syscall.Credential{Uid: nobody, Gid: nobody}, dir, flEnv("FILE_MOUNTED_CERTS=true")...)
	name := secretmanager.FileRootPrefix + path
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName, name)
	flWaitCert(t, s, 15*time.Second, chain, secretmanager.WorkloadCertName)
	if got := inotifyInstances(t, p.Pid()); got != 0 {
		t.Fatalf("the agent holds %d inotify instances while its user has none left", got)
	}
	polled := filewatch.DefaultPollInterval + flDebounce + 2*time.Second
	next := flCA(t).RootPEM()
	frWriteRoot(t, path, next)
	frWaitRoot(t, s, polled, name, next)
	if !strings.Contains(p.Logs(), `"reason":"no_instance"`) {
		t.Error("the missing inotify instance was not logged")
	}

	stopHog()
	testwait.Within(t, 3*polled, "the agent to take its inotify instance once instances are free", func() bool {
		return inotifyInstances(t, p.Pid()) == 1
	})
	next = flCA(t).RootPEM()
	frWriteRoot(t, path, next)
	frWaitRoot(t, s, flDebounce+time.Second, name, next)
	if code := p.ExitCode(); code != -1 {
		t.Fatalf("the agent exited with %d", code)
	}
}

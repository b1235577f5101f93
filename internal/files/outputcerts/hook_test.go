package outputcerts

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/secretmanager"
)

// hookRuns returns what each run of the test's reload command saw, in
// order: the files it was told of and the chain and key it read.
type hookRun struct {
	files      string
	chain, key []byte
}

func hookRuns(t *testing.T, log string) []hookRun {
	t.Helper()
	var out []hookRun
	for i := 0; ; i++ {
		files, err := os.ReadFile(filepath.Join(log, strconv.Itoa(i)+".files"))
		if err != nil {
			return out
		}
		chain, _ := os.ReadFile(filepath.Join(log, strconv.Itoa(i)+".chain"))
		key, _ := os.ReadFile(filepath.Join(log, strconv.Itoa(i)+".key"))
		out = append(out, hookRun{files: strings.TrimSpace(string(files)), chain: chain, key: key})
	}
}

// A reload command runs once per rotation, after the new files are in
// place: the chain and key it reads are the new pair, and they match. The
// rotations come from the secret manager's schedule on a fake clock.
func TestHookRunsOncePerRotationWithTheFilesInPlace(t *testing.T) {
	fc := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	ca, err := localca.New(localca.Config{Intermediate: true, Now: fc.Now})
	if err != nil {
		t.Fatal(err)
	}
	client, err := devca.New(devca.Config{CA: ca})
	if err != nil {
		t.Fatal(err)
	}
	roots, err := secret.NewRoots(ca.RootPEM(), "test")
	if err != nil {
		t.Fatal(err)
	}
	id := pki.SPIFFEIdentity("cluster.local", "ns", "sa")
	m, err := secretmanager.New(secretmanager.Config{
		Identity: id, CA: client, Roots: roots, TTL: time.Hour, Clock: fc, Rand: func() float64 { return 0.5 }, Source: "ca",
		GraceRatio: 0.5, MaxConcurrentCSRs: 8, IdleGrace: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	dir, log := filepath.Join(t.TempDir(), "out"), t.TempDir()
	// The command records what it finds: the files it was told of, and
	// copies of the chain and key as they are when it runs.
	script := fmt.Sprintf(`n=$(ls %[1]q | grep -c files); cp "$OUTPUT_CERTS/cert-chain.pem" %[1]q/$n.chain; cp "$OUTPUT_CERTS/key.pem" %[1]q/$n.key; echo "$OUTPUT_CERTS_FILES" > %[1]q/$n.files`, log)
	hook, err := NewHook(HookConfig{Command: []string{"/bin/sh", "-c", script}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSync(SyncConfig{Secrets: m, Writer: newWriter(t, Config{Dir: dir}), Hook: hook})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- m.Run(ctx) }()
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}()

	// waitRuns waits until the command has run n times.
	waitRuns := func(n int) []hookRun {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			runs := hookRuns(t, log)
			if len(runs) >= n {
				return runs
			}
			if time.Now().After(deadline) {
				t.Fatalf("the reload command ran %d times, want %d", len(runs), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The first certificate: with the roots in one write, or after them.
	runs := waitRuns(1)
	if !strings.Contains(runs[len(runs)-1].files, files.CertChainFile) {
		runs = waitRuns(2)
	}
	n := len(runs)
	check := func(r hookRun) *secretmanager.Secret {
		t.Helper()
		cur, err := m.Secret(ctx, pki.Identity{}, secretmanager.WorkloadCertName)
		if err != nil {
			t.Fatal(err)
		}
		if string(r.chain) != string(cur.CertChain) || string(r.key) != string(cur.PrivateKey) {
			t.Fatal("the reload command did not find the new certificate and key in place")
		}
		if _, err := tls.X509KeyPair(r.chain, r.key); err != nil {
			t.Fatalf("the pair the reload command found: %v", err)
		}
		return cur
	}
	prev := check(runs[n-1])
	for rotation := 1; rotation <= 3; rotation++ {
		// Step to the renewal time (half the life, no jitter).
		fc.Step(31 * time.Minute)
		runs = waitRuns(n + 1)
		if runs[n].files != files.KeyFile+","+files.CertChainFile {
			t.Errorf("rotation %d: the command was told of %q", rotation, runs[n].files)
		}
		cur := check(runs[n])
		if cur.Leaf.SerialNumber.Cmp(prev.Leaf.SerialNumber) == 0 {
			t.Fatalf("rotation %d: no new certificate", rotation)
		}
		prev = cur
		n++
		// Exactly once: the next rotation's run is the next one.
	}
	if got := len(hookRuns(t, log)); got != n {
		t.Errorf("%d runs after 3 rotations, want %d", got, n)
	}
}

func TestHookCommandIsBoundedInTime(t *testing.T) {
	h, err := NewHook(HookConfig{Command: []string{"/bin/sh", "-c", "sleep 60 & sleep 60"}, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Fire(context.Background(), t.TempDir(), []string{files.KeyFile})
	if err == nil || !strings.Contains(err.Error(), "killed after 100ms") {
		t.Fatalf("Fire: %v", err)
	}
}

func TestHookCommandFailureIsReported(t *testing.T) {
	h, err := NewHook(HookConfig{Command: []string{"/bin/sh", "-c", "echo reload refused >&2; exit 3"}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Fire(context.Background(), t.TempDir(), nil); err == nil || !strings.Contains(err.Error(), "reload refused") {
		t.Fatalf("Fire: %v", err)
	}
}

// sleeper is a process of the test's: exited is closed once it ended,
// with err its exit status.
type sleeper struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

// startSleeper starts a process named name (a copy of sleep).
func startSleeper(t *testing.T, name string) *sleeper {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &sleeper{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-p.exited })
	return p
}

// signalled waits for the process to end by sig.
func signalled(t *testing.T, p *sleeper, sig syscall.Signal) {
	t.Helper()
	select {
	case <-p.exited:
		var ee *exec.ExitError
		if !errors.As(p.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != sig {
			t.Fatalf("the process ended with %v, want signal %v", p.err, sig)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the process was not signalled")
	}
}

func TestHookSignalsThePIDFilesProcess(t *testing.T) {
	app := startSleeper(t, "app")
	pidFile := filepath.Join(t.TempDir(), "app.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(app.cmd.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := NewHook(HookConfig{PIDFile: pidFile, Signal: syscall.SIGUSR1})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Fire(context.Background(), t.TempDir(), nil); err != nil {
		t.Fatal(err)
	}
	signalled(t, app, syscall.SIGUSR1)

	if err := os.WriteFile(pidFile, []byte("nope"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.Fire(context.Background(), t.TempDir(), nil); err == nil {
		t.Error("a pid file without a pid was accepted")
	}
}

// The pid file is outside input: whoever can write it chooses whom the agent
// signals. The agent's own pid, pid 1, and a file another uid owns or others
// may write are refused, and nothing is signalled.
func TestHookPIDFileRefusals(t *testing.T) {
	app := startSleeper(t, "app")
	dir := t.TempDir()
	tests := []struct {
		name  string
		pid   int
		mode  os.FileMode
		owner int // -1: the test's own uid
		want  string
	}{
		{"the agent's own pid", os.Getpid(), 0o644, -1, "the agent itself"},
		{"pid 1", 1, 0o644, -1, "pid 1"},
		{"owned by another uid", app.cmd.Process.Pid, 0o644, 65534, "owned by uid 65534"},
		{"world-writable", app.cmd.Process.Pid, 0o666, -1, "writable by its group or others"},
		{"group-writable", app.cmd.Process.Pid, 0o664, -1, "writable by its group or others"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pidFile := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".pid")
			if err := os.WriteFile(pidFile, []byte(strconv.Itoa(tt.pid)+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(pidFile, tt.mode); err != nil {
				t.Fatal(err)
			}
			if tt.owner >= 0 {
				if os.Geteuid() != 0 {
					t.Skip("chown needs root")
				}
				if err := os.Chown(pidFile, tt.owner, tt.owner); err != nil {
					t.Fatal(err)
				}
			}
			h, err := NewHook(HookConfig{PIDFile: pidFile, Signal: syscall.SIGUSR1})
			if err != nil {
				t.Fatal(err)
			}
			err = h.Fire(context.Background(), t.TempDir(), nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Fire: %v, want a refusal saying %q", err, tt.want)
			}
		})
	}
	select {
	case <-app.exited:
		t.Fatalf("the process was signalled: %v", app.err)
	default:
	}
}

func TestHookSignalsProcessesByName(t *testing.T) {
	name := fmt.Sprintf("reload-me-%d", os.Getpid()) // longer than comm's 15 bytes: found by its argv[0]
	app := startSleeper(t, name)
	h, err := NewHook(HookConfig{ProcessName: name, Signal: syscall.SIGHUP})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, 20*time.Second, "the process found by name", func() bool {
		pids, err := ProcessesNamed("/proc", name)
		return err == nil && len(pids) == 1
	})
	if err := h.Fire(context.Background(), t.TempDir(), nil); err != nil {
		t.Fatal(err)
	}
	signalled(t, app, syscall.SIGHUP)

	if err := (&Hook{cfg: HookConfig{ProcessName: "no-such-process-here", Proc: "/proc", Signal: syscall.SIGHUP}}).signalByName(); err == nil {
		t.Error("no error when no process has the name")
	}
}

func TestNewHook(t *testing.T) {
	if h, err := NewHook(HookConfig{}); h != nil || err != nil {
		t.Errorf("nothing asked: %v, %v", h, err)
	}
	if err := (*Hook)(nil).Fire(context.Background(), "", nil); err != nil {
		t.Errorf("nil hook: %v", err)
	}
	if _, err := NewHook(HookConfig{Command: []string{""}, Timeout: time.Minute}); err == nil {
		t.Error("an empty program was accepted")
	}
	// Zero is no default: the caller passes what the setting says.
	for _, cfg := range []HookConfig{
		{Command: []string{"true"}},
		{Command: []string{"true"}, Timeout: -time.Second},
		{PIDFile: "/run/app.pid"},
		{ProcessName: "app"},
	} {
		if h, err := NewHook(cfg); err == nil {
			t.Errorf("NewHook(%+v) accepted a zero timeout or signal: %+v", cfg, h)
		}
	}
	if _, err := NewHook(HookConfig{Command: []string{"true"}, Timeout: time.Minute, PIDFile: "/run/app.pid"}); err == nil || !strings.Contains(err.Error(), "HookConfig.Signal ") {
		t.Errorf("a pid file without a signal: %v, want HookConfig.Signal named", err)
	}
	if _, err := NewHook(HookConfig{Command: []string{"true"}}); err == nil || !strings.Contains(err.Error(), "HookConfig.Timeout ") {
		t.Errorf("a command without a timeout: %v, want HookConfig.Timeout named", err)
	}
}

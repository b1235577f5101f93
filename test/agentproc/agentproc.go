// Package agentproc runs the real agent binary for end-to-end tests: it
// builds cmd/agent once per test binary (or uses MESHAGENT_TEST_AGENT_BIN),
// starts it in a working directory of the test's choosing with only the
// environment given, captures its logs, and stops it (SIGTERM, then SIGINT
// to skip the drain) when the test ends. The process is owned by the returned Proc.
package agentproc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/test/heavy"
)

// SDSSocket is the SDS socket path relative to the working directory.
const SDSSocket = "var/run/secrets/workload-spiffe-uds/socket"

// Binary returns the agent binary, building it on first use.
var Binary = sync.OnceValues(func() (string, error) {
	if bin := os.Getenv("MESHAGENT_TEST_AGENT_BIN"); bin != "" {
		return filepath.Abs(bin)
	}
	dir, err := os.MkdirTemp("", "agentbin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "meshagent")
	out, err := BuildCommand(context.Background(), bin).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v: %s", err, out)
	}
	return bin, nil
})

// BuildTags and BuildEnv are how the agent binary is built, here and by
// `make build` (the Makefile repeats them; TestMakefileBuildsTheSameBinary
// keeps the two the same):
//   - grpcnotrace leaves out gRPC's golang.org/x/net/trace, which links
//     html/template; its reflective method calls make the linker keep every
//     exported method of every type in an interface, ~8 MB of code, most of
//     it resident after start-up;
//   - CGO_ENABLED=0 links the binary statically (Go's own DNS resolver and
//     user database), so no dynamic loader or libc runs before main.
const BuildTags = "grpcnotrace"

// BuildEnv is the environment added to the go command's for a build.
var BuildEnv = []string{"CGO_ENABLED=0"}

// BuildCommand returns the go command that builds cmd/agent into out. Its
// working directory is the caller's, which must be inside the module.
func BuildCommand(ctx context.Context, out string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", BuildTags, "-o", out, "github.com/meshagent/meshagent/cmd/agent")
	cmd.Env = append(os.Environ(), BuildEnv...)
	return cmd
}

// TempDir returns a short new directory removed when the test ends, so Unix
// socket paths under it fit a socket address.
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Proc is one running agent.
type Proc struct {
	Dir  string
	mu   sync.Mutex
	logs bytes.Buffer
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *Proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.Write(b)
}

// Logs returns everything the agent has written so far.
func (p *Proc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// Socket is the absolute SDS socket path.
func (p *Proc) Socket() string { return filepath.Join(p.Dir, SDSSocket) }

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// ExitCode is the process's exit code, or -1 while it runs.
func (p *Proc) ExitCode() int {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Start runs `meshagent run` in dir with env (plus PATH and HOME) and
// stops it when the test ends.
func Start(t testing.TB, dir string, env ...string) *Proc {
	t.Helper()
	return start(t, dir, nil, []string{"run"}, env)
}

// StartCommand is Start for another subcommand: `meshagent <args...>`
// (e.g. trust-publisher).
func StartCommand(t testing.TB, dir string, args []string, env ...string) *Proc {
	t.Helper()
	return start(t, dir, nil, args, env)
}

// StartAs is Start with the process running as cred's user and group (the
// tests run as root; this is how one sees what an unprivileged agent may
// not do). dir must be writable by that user; the binary's directory is
// made readable by everyone.
func StartAs(t testing.TB, cred *syscall.Credential, dir string, env ...string) *Proc {
	t.Helper()
	return start(t, dir, cred, []string{"run"}, env)
}

func start(t testing.TB, dir string, cred *syscall.Credential, args, env []string) *Proc {
	t.Helper()
	heavy.Skip(t, "starts the built agent")
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := &Proc{Dir: dir, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = dir
	if cred != nil {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}, env...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			l := p.Logs()
			if len(l) > 16000 {
				l = l[:6000] + "\n[...]\n" + l[len(l)-10000:]
			}
			t.Logf("agent logs:\n%s", l)
		}
	})
	return p
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop stops the process as a clean stop without the drain: SIGTERM starts
// the drain (docs/operations.md, "Termination"), SIGINT, a second signal,
// ends it at once (two SIGTERMs sent together may reach the process as
// one). It waits up to 5 s before killing the process, and may be called
// more than once.
func (p *Proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

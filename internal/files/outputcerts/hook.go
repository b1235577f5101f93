package outputcerts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/meshagent/meshagent/internal/files/regularfile"
	"github.com/meshagent/meshagent/internal/logkeys"
)

// HookConfig configures a Hook: what tells an application that the files
// changed. Any of Command, PIDFile and ProcessName may be set; all that are
// set are used.
type HookConfig struct {
	// Command is run (argv; no shell) after the files changed, with the
	// environment of the agent plus OUTPUT_CERTS=<dir> and
	// OUTPUT_CERTS_FILES=<the files replaced, comma-separated>.
	Command []string
	// Timeout bounds Command: when it passes, the command's process group
	// is killed. Required (positive) with Command.
	Timeout time.Duration
	// PIDFile names a file holding the pid of a process to signal.
	PIDFile string
	// ProcessName names processes to signal: every process of the agent's
	// pid namespace (its /proc) whose command name (comm) or first argument's
	// base name is this, except the agent.
	ProcessName string
	// Signal is sent to PIDFile's and ProcessName's processes. Required
	// with either.
	Signal syscall.Signal
	// Proc is the proc file system read for ProcessName. Empty means
	// "/proc".
	Proc string
	// Logger is narrowed with .Named("outputcerts"). Nil means zap.NewNop().
	Logger *zap.Logger
}

// Hook tells an application that the OUTPUT_CERTS files changed, as
// spiffe-helper's reload hooks do. Sync fires it after each write that
// replaced files, strictly after the files are complete (renamed into place
// and the directory synced). It holds no state between firings.
type Hook struct {
	cfg HookConfig
	log *zap.Logger
}

// NewHook checks cfg and returns the hook; nil, nil when cfg asks for
// nothing.
func NewHook(cfg HookConfig) (*Hook, error) {
	if len(cfg.Command) == 0 && cfg.PIDFile == "" && cfg.ProcessName == "" {
		return nil, nil
	}
	if len(cfg.Command) > 0 && cfg.Command[0] == "" {
		return nil, errors.New("outputcerts: the reload command has no program")
	}
	if len(cfg.Command) > 0 && cfg.Timeout <= 0 {
		return nil, fmt.Errorf("outputcerts: HookConfig.Timeout %s is not positive", cfg.Timeout)
	}
	if (cfg.PIDFile != "" || cfg.ProcessName != "") && cfg.Signal <= 0 {
		return nil, fmt.Errorf("outputcerts: HookConfig.Signal %d is not a signal", int(cfg.Signal))
	}
	if cfg.Proc == "" {
		cfg.Proc = "/proc"
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Hook{cfg: cfg, log: cfg.Logger.Named("outputcerts")}, nil
}

// Fire runs the command and sends the signals for the files written to
// dir. Each part that fails is logged and the others still run; the
// errors are returned joined. A nil Hook does nothing.
func (h *Hook) Fire(ctx context.Context, dir string, written []string) error {
	if h == nil {
		return nil
	}
	var errs []error
	if len(h.cfg.Command) > 0 {
		errs = append(errs, h.run(ctx, dir, written))
	}
	if h.cfg.PIDFile != "" {
		errs = append(errs, h.signalPIDFile())
	}
	if h.cfg.ProcessName != "" {
		errs = append(errs, h.signalByName())
	}
	err := errors.Join(errs...)
	if err != nil {
		h.log.Warn("reload hook failed", zap.Strings(logkeys.Files, written), zap.Error(err))
	} else {
		h.log.Info("reload hook done", zap.Strings(logkeys.Files, written))
	}
	return err
}

// run runs the command in a process group of its own, killed with the
// group when the timeout passes or ctx ends.
func (h *Hook) run(ctx context.Context, dir string, written []string) error {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.cfg.Command[0], h.cfg.Command[1:]...)
	cmd.Env = append(os.Environ(), "OUTPUT_CERTS="+dir, "OUTPUT_CERTS_FILES="+strings.Join(written, ","))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		return fmt.Errorf("reload command %s: killed after %v: %w", cmd.Path, h.cfg.Timeout, ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("reload command %s: %w: %s", cmd.Path, err, tail(out.Bytes()))
	}
	return nil
}

// signalPIDFile signals the pid the pid file names. The file must be a
// regular file owned by root or by the agent's uid and writable by no one
// else, or anyone who can write it chooses whom the agent signals; and the pid
// must be neither the agent's own (SIGHUP would end it) nor 1 (init, or the
// container's first process).
func (h *Hook) signalPIDFile() error {
	pid, err := readPIDFile(h.cfg.PIDFile)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, h.cfg.Signal); err != nil {
		return fmt.Errorf("signalling pid %d of %s: %w", pid, h.cfg.PIDFile, err)
	}
	return nil
}

func readPIDFile(path string) (int, error) {
	f, err := regularfile.Open(path)
	if err != nil {
		return 0, fmt.Errorf("reload pid file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("reload pid file: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return 0, fmt.Errorf("reload pid file %s is owned by uid %d: only root's or the agent's own (uid %d) is trusted", path, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return 0, fmt.Errorf("reload pid file %s is writable by its group or others (mode %v): not trusted", path, fi.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, 64))
	if err != nil {
		return 0, fmt.Errorf("reload pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	switch {
	case err != nil || pid <= 0:
		return 0, fmt.Errorf("reload pid file %s: %q is not a pid", path, strings.TrimSpace(string(data)))
	case pid == 1:
		return 0, fmt.Errorf("reload pid file %s names pid 1: not signalled", path)
	case pid == os.Getpid():
		return 0, fmt.Errorf("reload pid file %s names the agent itself (pid %d): not signalled", path, pid)
	}
	return pid, nil
}

func (h *Hook) signalByName() error {
	pids, err := ProcessesNamed(h.cfg.Proc, h.cfg.ProcessName)
	if err != nil {
		return err
	}
	if len(pids) == 0 {
		return fmt.Errorf("no process named %q to signal", h.cfg.ProcessName)
	}
	var errs []error
	for _, pid := range pids {
		if err := syscall.Kill(pid, h.cfg.Signal); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("signalling %s (pid %d): %w", h.cfg.ProcessName, pid, err))
		}
	}
	return errors.Join(errs...)
}

// ProcessesNamed returns the pids under proc (a proc file system) whose
// command name (comm, which the kernel cuts to 15 bytes) or first
// argument's base name is name, leaving out the calling process.
func ProcessesNamed(proc, name string) ([]int, error) {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	self := os.Getpid()
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join(proc, e.Name(), "comm"))
		if strings.TrimSuffix(string(comm), "\n") == name || argv0(proc, e.Name()) == name {
			out = append(out, pid)
		}
	}
	return out, nil
}

// argv0 is the base name of the first argument of process pid, or "".
func argv0(proc, pid string) string {
	cmdline, err := os.ReadFile(filepath.Join(proc, pid, "cmdline"))
	if err != nil || len(cmdline) == 0 {
		return ""
	}
	first, _, _ := bytes.Cut(cmdline, []byte{0})
	return filepath.Base(string(first))
}

// tail is the end of a command's output, for an error line.
func tail(out []byte) string {
	out = bytes.TrimSpace(out)
	if len(out) > 200 {
		out = out[len(out)-200:]
	}
	return strings.Join(strings.Fields(string(out)), " ")
}

package kubeenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// stopGrace is how long a process has to exit after SIGTERM before it is killed.
const stopGrace = 15 * time.Second

// logTailBytes is how much of a process's log an error shows.
const logTailBytes = 4096

// process is one child process. done is closed once it has exited and err is set.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	// Appending: a restarted process adds to the log its first run wrote.
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kubeenv: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = log
	cmd.Stderr = log
	// If the test binary dies, so do its servers.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("kubeenv: starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// exitError describes an exit the caller did not ask for. Call it after done is closed.
func (p *process) exitError() error {
	tail := p.logTail()
	err := fmt.Errorf("kubeenv: %s exited: %v\n%s", p.name, p.err, tail)
	if isPortInUse(tail) {
		err = fmt.Errorf("%w (%w)", err, errPortInUse)
	}
	return err
}

// stop sends SIGTERM, waits up to stopGrace, then kills. An exit caused by the signal
// is not an error; an exit before it is.
func (p *process) stop() error {
	select {
	case <-p.done:
		return p.exitError()
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopGrace):
	}
	p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("kubeenv: %s did not exit within %v of SIGTERM; killed", p.name, stopGrace)
}

func (p *process) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(log %s: %v)", p.logPath, err)
	}
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return fmt.Sprintf("--- end of %s ---\n%s", p.logPath, b)
}

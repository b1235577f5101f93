package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// process is one component, started inside the network namespace with nsenter (which
// execs it: the PID is the component's), its output in <dir>/logs/<name>.log.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func (c *Cluster) start(name, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(c.dir, "logs", name+".log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("nsenter", append([]string{"--net=" + c.netnsPath, "--", bin}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	// No Pdeathsig: it fires when the forking OS thread exits, and InNetns ends threads.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	c.procs[name] = p
	c.logf("started %s (pid %d), log %s", name, cmd.Process.Pid, logPath)
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process's group, and SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

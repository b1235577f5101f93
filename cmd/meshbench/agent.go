package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/meshagent/meshagent/internal/files"
)

// Paths inside an agent's working directory, as pilot-agent uses them.
const (
	tokenPath  = "var/run/secrets/tokens/istio-token"
	caRootPath = "var/run/secrets/istio/" + files.RootCertFile
	sdsPath    = "var/run/secrets/workload-spiffe-uds/socket"
	xdsPath    = "etc/istio/proxy/XDS"
)

// agentConfig is how one agent process is run.
type agentConfig struct {
	// Binary is the meshagent executable; Args are its arguments.
	Binary string
	Args   []string
	// KeyType is MESHAGENT_KEY_TYPE, e.g. "ec-p256" or "rsa-2048".
	KeyType string
	// SecretTTL is SECRET_TTL; zero leaves the default (24h).
	SecretTTL time.Duration
	// CAAddr is the test CA (CA_ADDR); ServerName is the name both the CA and
	// the control plane present (ISTIOD_SAN).
	CAAddr     string
	ServerName string
	// XDSAddr is the control plane (PROXY_CONFIG discoveryAddress).
	XDSAddr string
	// RootPEM is the CA root, also used as the xDS root.
	RootPEM []byte
	// Token is written to the token file.
	Token string
	// TrustDomain, Namespace and ServiceAccount make the identity.
	TrustDomain, Namespace, ServiceAccount string
	// LogLevel is MESHAGENT_LOG_LEVEL.
	LogLevel string
	// StatusPort is STATUS_PORT; zero lets the agent pick a free port.
	StatusPort int
	// Env is added to the environment, after the settings above.
	Env []string
}

// prepareAgentDir lays out dir as the agent's working directory: the token
// and the CA root where pilot-agent expects them.
func prepareAgentDir(dir string, cfg agentConfig) error {
	files := []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{tokenPath, []byte(cfg.Token), 0o600},
		{caRootPath, cfg.RootPEM, 0o644},
	}
	// The pod's emptyDir volumes that hold the sockets exist before the
	// agent starts (workload-socket, istio-envoy).
	for _, sock := range []string{sdsPath, xdsPath} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(sock)), 0o750); err != nil {
			return fmt.Errorf("preparing agent directory: %w", err)
		}
	}
	for _, f := range files {
		p := filepath.Join(dir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			return fmt.Errorf("preparing agent directory: %w", err)
		}
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			return fmt.Errorf("preparing agent directory: %w", err)
		}
	}
	return nil
}

// agentEnv is the agent's whole environment: PATH, HOME and GODEBUG (to
// trace or tune the Go runtime of the measured agent) from ours, and the
// pilot-agent settings for the test CA and control plane. Nothing else is
// inherited, so the caller's environment cannot change what is measured.
func agentEnv(dir string, cfg agentConfig) []string {
	env := []string{
		"CA_ADDR=" + cfg.CAAddr,
		"ISTIOD_SAN=" + cfg.ServerName,
		"TRUST_DOMAIN=" + cfg.TrustDomain,
		"POD_NAMESPACE=" + cfg.Namespace,
		"SERVICE_ACCOUNT=" + cfg.ServiceAccount,
		"POD_NAME=meshbench-0",
		// No drain: the agent is stopped with SIGTERM and a grace of its own
		// (docs/operations.md, "Termination").
		`PROXY_CONFIG={"discoveryAddress":"` + cfg.XDSAddr + `","terminationDrainDuration":"0s"}`,
		"XDS_ROOT_CA=" + filepath.Join(dir, caRootPath),
		"STATUS_PORT=" + strconv.Itoa(cfg.StatusPort),
		"MESHAGENT_STATUS_HOST=127.0.0.1",
		"MESHAGENT_KEY_TYPE=" + cfg.KeyType,
	}
	if cfg.SecretTTL > 0 {
		env = append(env, "SECRET_TTL="+cfg.SecretTTL.String())
	}
	if cfg.LogLevel != "" {
		env = append(env, "MESHAGENT_LOG_LEVEL="+cfg.LogLevel)
	}
	env = append(env, cfg.Env...)
	for _, k := range []string{"PATH", "HOME", "GODEBUG"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// agentProc is one running agent.
type agentProc struct {
	cfg     agentConfig
	dir     string
	cmd     *exec.Cmd
	logPath string
	// Started is the time just before the process was started.
	Started time.Time

	exited  chan struct{}
	waitErr error
	stop    sync.Once
}

// live tracks every agent started, so an interrupted run can end them.
var live = struct {
	sync.Mutex
	procs map[*agentProc]struct{}
}{procs: map[*agentProc]struct{}{}}

// startAgent prepares dir and starts the agent in it, logging to
// dir/agent.log. The agent is killed if this program dies.
func startAgent(dir string, cfg agentConfig) (*agentProc, error) {
	if err := prepareAgentDir(dir, cfg); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "agent.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating agent log: %w", err)
	}
	defer logf.Close() // the child holds its own copy
	cmd := exec.Command(cfg.Binary, cfg.Args...)
	cmd.Dir = dir
	cmd.Env = agentEnv(dir, cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	a := &agentProc{cfg: cfg, dir: dir, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	a.Started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", cfg.Binary, err)
	}
	live.Lock()
	live.procs[a] = struct{}{}
	live.Unlock()
	go func() {
		a.waitErr = cmd.Wait()
		close(a.exited)
	}()
	return a, nil
}

// Pid is the agent's process ID.
func (a *agentProc) Pid() int { return a.cmd.Process.Pid }

// SDSSocket and XDSSocket are the absolute paths of the agent's sockets.
func (a *agentProc) SDSSocket() string { return filepath.Join(a.dir, sdsPath) }
func (a *agentProc) XDSSocket() string { return filepath.Join(a.dir, xdsPath) }

// StatusAddr is the status server's address, or "" when the port was left
// to the agent.
func (a *agentProc) StatusAddr() string {
	if a.cfg.StatusPort == 0 {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(a.cfg.StatusPort))
}

// Exited is closed when the process has ended.
func (a *agentProc) Exited() <-chan struct{} { return a.exited }

// ExitErr describes how the process ended; call it after Exited is closed.
func (a *agentProc) ExitErr() error {
	if a.waitErr == nil {
		return errors.New("agent exited with status 0")
	}
	return fmt.Errorf("agent exited: %w", a.waitErr)
}

// LogTail is the end of the agent's log, for error messages.
func (a *agentProc) LogTail() string {
	b, err := os.ReadFile(a.logPath)
	if err != nil {
		return ""
	}
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(bytes.TrimSpace(b))
}

// Stop sends SIGTERM, waits up to grace for the process to end, then kills
// it. It is safe to call more than once and from several goroutines.
func (a *agentProc) Stop(grace time.Duration) {
	a.stop.Do(func() {
		defer func() {
			live.Lock()
			delete(live.procs, a)
			live.Unlock()
		}()
		select {
		case <-a.exited:
			return
		default:
		}
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-a.exited:
		case <-t.C:
			_ = a.cmd.Process.Kill()
			<-a.exited
		}
	})
}

// killAll kills every agent still running, at once.
func killAll() {
	live.Lock()
	procs := make([]*agentProc, 0, len(live.procs))
	for a := range live.procs {
		procs = append(procs, a)
	}
	live.Unlock()
	for _, a := range procs {
		a.Stop(0)
	}
}

// String names the process for messages.
func (a *agentProc) String() string { return "meshagent pid " + strconv.Itoa(a.Pid()) }

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

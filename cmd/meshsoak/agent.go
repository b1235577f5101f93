package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/meshagent/meshagent/internal/files"
)

// Paths inside the agent's working directory, laid out as pilot-agent's.
const (
	tokenFile  = "var/run/secrets/tokens/istio-token"
	rootFile   = "var/run/secrets/istio/" + files.RootCertFile
	sdsSocket  = "var/run/secrets/workload-spiffe-uds/socket"
	xdsSocket  = "etc/istio/proxy/XDS"
	agentLog   = "agent.log"
	secretTTL  = 30 * time.Second
	soakToken  = "meshsoak-token"
	soakDomain = "cluster.local"
	soakNS     = "soak"
	soakSA     = "meshsoak"
)

// agent is the one meshagent process of a soak.
type agent struct {
	dir        string
	statusPort int
	cmd        *exec.Cmd
	exited     chan struct{}
	waitErr    error
}

// agentParams are the addresses and root the agent is configured with.
type agentParams struct {
	binary     string
	dir        string
	caAddr     string
	xdsAddr    string
	serverName string
	rootPEM    []byte
	// uid the agent runs as (its group too); -1 means this process's user.
	uid int
}

// startAgent lays out p.dir and starts the agent in it with only the
// environment set here, logging to p.dir/agent.log.
func startAgent(p agentParams) (*agent, error) {
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{{tokenFile, []byte(soakToken), 0o600}, {rootFile, p.rootPEM, 0o644}} {
		full := filepath.Join(p.dir, f.path)
		if err := os.MkdirAll(filepath.Dir(full), 0o750); err != nil {
			return nil, fmt.Errorf("preparing agent directory: %w", err)
		}
		if err := os.WriteFile(full, f.data, f.mode); err != nil {
			return nil, fmt.Errorf("preparing agent directory: %w", err)
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(p.dir, agentLog), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating agent log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(p.binary, "run")
	cmd.Dir = p.dir
	cmd.Env = []string{
		"CA_ADDR=" + p.caAddr,
		"ISTIOD_SAN=" + p.serverName,
		"TRUST_DOMAIN=" + soakDomain,
		"POD_NAMESPACE=" + soakNS,
		"SERVICE_ACCOUNT=" + soakSA,
		"POD_NAME=meshsoak-0",
		// No drain: the agent is stopped with SIGTERM and a grace of its own
		// (docs/operations.md, "Termination").
		`PROXY_CONFIG={"discoveryAddress":"` + p.xdsAddr + `","terminationDrainDuration":"0s"}`,
		"XDS_ROOT_CA=" + filepath.Join(p.dir, rootFile),
		"STATUS_PORT=" + strconv.Itoa(port),
		"MESHAGENT_STATUS_HOST=127.0.0.1",
		"SECRET_TTL=" + secretTTL.String(),
		"MESHAGENT_LOG_LEVEL=info",
		// The soak's clients all run as one uid, its one caller in a sidecar:
		// the per-caller connection limit (32) is for a real pod's Envoy and
		// applications, not for the soak's hundreds of clients.
		// The hostile clients' file-cert:/file-root: resources are under the
		// soak's directory: the only one they may name.
		"MESHAGENT_FILE_RESOURCE_DIRS=" + p.dir,
		"MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER=100000",
		"MESHAGENT_SOCKET_MAX_CONNECTION_RATE_PER_CALLER=100000",
		"MESHAGENT_SOCKET_MAX_UNARY_PER_CALLER=100000",
	}
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if p.uid >= 0 && p.uid != os.Geteuid() {
		if err := chownTree(p.dir, p.uid); err != nil {
			return nil, fmt.Errorf("handing the agent directory to uid %d: %w", p.uid, err)
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(p.uid), Gid: uint32(p.uid)}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", p.binary, err)
	}
	a := &agent{dir: p.dir, statusPort: port, cmd: cmd, exited: make(chan struct{})}
	go func() {
		a.waitErr = cmd.Wait()
		close(a.exited)
	}()
	return a, nil
}

// chownTree gives dir and everything under it to uid (and the group of the
// same number).
func chownTree(dir string, uid int) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}

func (a *agent) pid() int               { return a.cmd.Process.Pid }
func (a *agent) path(rel string) string { return filepath.Join(a.dir, rel) }

// exitedErr is non-nil once the process has ended.
func (a *agent) exitedErr() error {
	select {
	case <-a.exited:
		if a.waitErr == nil {
			return errors.New("agent exited with status 0")
		}
		return fmt.Errorf("agent exited: %w", a.waitErr)
	default:
		return nil
	}
}

// stop sends SIGTERM and kills the process if it has not ended after grace.
func (a *agent) stop(grace time.Duration) {
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
}

// goroutines reads the agent's goroutine count from its status server.
func (a *agent) goroutines(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	url := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(a.statusPort)) + "/debug/pprof/goroutine?debug=1"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("fetching goroutine profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("fetching goroutine profile: %s", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return 0, fmt.Errorf("reading goroutine profile: %w", err)
	}
	return parseGoroutineTotal(b)
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

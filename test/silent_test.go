package test

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/heavy"
	"github.com/meshagent/meshagent/test/istioca"
)

// Nothing silent (docs/troubleshooting.md): what the built binary does with
// configurations that cannot work, and the states it must not keep quiet.

// caEnv is a CA-mode configuration that gets past the identity checks.
func caEnv(dir string, extra ...string) []string {
	return append([]string{
		"POD_NAMESPACE=shop", "SERVICE_ACCOUNT=web", "STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1",
		"CA_ADDR=127.0.0.1:1", "MESHAGENT_XDS_PROXY=false",
		"MESHAGENT_SDS_SOCKET=" + filepath.Join(dir, "sds", "socket"),
	}, extra...)
}

// TestStartUpProblemsExitTwoWithOneLine: every configuration problem found
// at start exits 2 and writes exactly one line (no JSON log line besides
// the start-up ones) naming the setting and what to do.
func TestStartUpProblemsExitTwoWithOneLine(t *testing.T) {
	dir := agentproc.TempDir(t)
	notPEM := filepath.Join(dir, "not-pem.pem")
	regular := filepath.Join(dir, "regular")
	for _, f := range []string{notPEM, regular} {
		if err := os.WriteFile(f, []byte("hello\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name, setting string
		env           []string
	}{
		{"missing CA root", "CA_ROOT_CA", caEnv(dir, "CA_ROOT_CA="+filepath.Join(dir, "nope.pem"))},
		{"default CA root missing", "CA_ROOT_CA", caEnv(dir)},
		{"CA root is a directory", "CA_ROOT_CA", caEnv(dir, "CA_ROOT_CA="+dir)},
		{"CA root is not PEM", "CA_ROOT_CA", caEnv(dir, "CA_ROOT_CA="+notPEM)},
		{"socket under /proc", "MESHAGENT_SDS_SOCKET", []string{"MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_SDS_SOCKET=/proc/meshagent/socket"}},
		{"socket path is a regular file", "MESHAGENT_SDS_SOCKET", []string{"MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_SDS_SOCKET=" + regular}},
		{"socket path too long", "MESHAGENT_SDS_SOCKET", []string{"MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_SDS_SOCKET=" + filepath.Join(dir, strings.Repeat("d", 120), "socket")}},
		{"xDS root missing", "XDS_ROOT_CA", []string{"MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_XDS_PROXY=true", "XDS_ROOT_CA=" + filepath.Join(dir, "nope.pem"), "MESHAGENT_SDS_SOCKET=" + filepath.Join(dir, "y", "socket")}},
		{"xDS socket under /proc", "MESHAGENT_XDS_SOCKET", []string{"MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_XDS_PROXY=true", "XDS_ROOT_CA=SYSTEM", "MESHAGENT_SDS_SOCKET=" + filepath.Join(dir, "x", "socket"), "MESHAGENT_XDS_SOCKET=/proc/meshagent/XDS"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, out := runBinary(t, agentproc.TempDir(t), tt.env, "run")
			if code != 2 {
				t.Fatalf("exit %d, want 2; output:\n%s", code, out)
			}
			var lines []string
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				if strings.HasPrefix(l, "{") {
					if strings.Contains(l, `"level":"error"`) {
						t.Errorf("an error logged besides the one line: %s", l)
					}
					continue
				}
				lines = append(lines, l)
			}
			if len(lines) != 1 {
				t.Fatalf("%d plain lines, want 1:\n%s", len(lines), out)
			}
			if !strings.Contains(lines[0], tt.setting) || !strings.Contains(lines[0], "set "+tt.setting) {
				t.Errorf("line %q does not name %s and what to set", lines[0], tt.setting)
			}
			if strings.Contains(lines[0], ".sock") || strings.Contains(lines[0], "meshagent-probe") {
				t.Errorf("line %q names a temporary file", lines[0])
			}
		})
	}
}

// runBinary runs the agent binary with args and env (plus PATH) in dir
// and returns its exit code and combined output.
func runBinary(t *testing.T, dir string, env []string, args ...string) (int, string) {
	t.Helper()
	heavy.Skip(t, "runs the built agent")
	bin, err := agentproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	done := make(chan struct{})
	timer := time.AfterFunc(20*time.Second, func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
		}
	})
	defer timer.Stop()
	out, err := cmd.CombinedOutput()
	close(done)
	if err != nil && !errors.As(err, new(*exec.ExitError)) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// statusBase waits for the agent's "status server listening" line and
// returns the server's base URL.
func statusBase(t *testing.T, p *agentproc.Proc) string {
	t.Helper()
	var addr string
	testwait.Within(t, 15*time.Second, "the status server", func() bool {
		for _, l := range strings.Split(p.Logs(), "\n") {
			var e struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal([]byte(l), &e) == nil && e.Msg == "status server listening" && e.Addr != "" {
				addr = e.Addr
				return true
			}
		}
		select {
		case <-p.Done():
			t.Fatalf("the agent exited (%d)", p.ExitCode())
		default:
		}
		return false
	})
	return "http://" + addr
}

// getStatus returns the code and body of GET base+path.
func getStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestOutputCertsGroupCanReadTheFiles follows docs/vm.md: the agent makes
// OUTPUT_CERTS itself with MESHAGENT_OUTPUT_CERTS_GROUP set, and a user of
// that group (not the agent's user) reads the chain, the roots and, with
// MESHAGENT_OUTPUT_CERTS_KEY_MODE=0640, the key.
func TestOutputCertsGroupCanReadTheFiles(t *testing.T) {
	const gid, otherUID = 4242, 4243
	dir := agentproc.TempDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "lib", "certs")
	p := agentproc.Start(t, dir, "MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1",
		"OUTPUT_CERTS="+out, "MESHAGENT_OUTPUT_CERTS_GROUP=4242", "MESHAGENT_OUTPUT_CERTS_KEY_MODE=0640")
	waitFor(t, "the three files written", func() bool {
		for _, f := range []string{"cert-chain.pem", "key.pem", "root-cert.pem"} {
			if _, err := os.Stat(filepath.Join(out, f)); err != nil {
				return false
			}
		}
		return true
	})
	st, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o750 || st.Sys().(*syscall.Stat_t).Gid != gid {
		t.Errorf("directory %v gid %d, want 0750 gid %d", st.Mode(), st.Sys().(*syscall.Stat_t).Gid, gid)
	}
	for _, f := range []string{"cert-chain.pem", "key.pem", "root-cert.pem"} {
		cat := exec.Command("cat", filepath.Join(out, f))
		cat.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUID, Gid: gid}}
		if b, err := cat.CombinedOutput(); err != nil || !strings.Contains(string(b), "-----BEGIN") {
			t.Errorf("a user of group %d cannot read %s: %v %s", gid, f, err, b)
		}
	}
	_ = p
}

// TestOutputCertsUnwritableIsNotReady: OUTPUT_CERTS naming a regular file
// makes readiness 503 naming OUTPUT_CERTS, the failure is logged once
// (however often it is retried), and the agent is ready once the path can
// be written.
func TestOutputCertsUnwritableIsNotReady(t *testing.T) {
	dir := agentproc.TempDir(t)
	out := filepath.Join(dir, "out")
	if err := os.WriteFile(out, []byte("a file, not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := agentproc.Start(t, dir, "MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", "OUTPUT_CERTS="+out)
	base := statusBase(t, p)
	var body string
	waitFor(t, "readiness naming OUTPUT_CERTS", func() bool {
		var code int
		code, body = getStatus(t, base+"/healthz/ready")
		return code == 503 && strings.Contains(body, "OUTPUT_CERTS")
	})
	if code, _ := getStatus(t, base+"/healthz/live"); code != 200 {
		t.Errorf("live %d: an unwritable output is not a reason to restart", code)
	}
	if n := strings.Count(p.Logs(), "writing output certificates failed"); n != 1 {
		t.Errorf("the failure is logged %d times, want once:\n%s", n, p.Logs())
	}
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}
	// The retry (10 s) writes the files and readiness recovers.
	testwait.Within(t, 25*time.Second, "readiness after the directory became writable", func() bool {
		code, _ := getStatus(t, base+"/healthz/ready")
		return code == 200
	})
	if _, err := os.Stat(filepath.Join(out, "cert-chain.pem")); err != nil {
		t.Error(err)
	}
}

// TestSIGHUPDoesNotStopTheAgent: SIGHUP is logged and ignored
// (docs/operations.md); SIGTERM then stops the agent with 0 and leaves no
// socket behind.
func TestSIGHUPDoesNotStopTheAgent(t *testing.T) {
	dir := agentproc.TempDir(t)
	p := agentproc.Start(t, dir, "MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1")
	base := statusBase(t, p)
	waitFor(t, "ready", func() bool { code, _ := getStatus(t, base+"/healthz/ready"); return code == 200 })
	if err := syscall.Kill(p.Pid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "SIGHUP logged", func() bool { return strings.Contains(p.Logs(), "SIGHUP ignored") })
	if code, _ := getStatus(t, base+"/healthz/ready"); code != 200 {
		t.Errorf("ready %d after SIGHUP", code)
	}
	if code := p.ExitCode(); code != -1 {
		t.Fatalf("the agent exited (%d) on SIGHUP", code)
	}
	p.Stop()
	if code := p.ExitCode(); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
	if _, err := os.Lstat(p.Socket()); err == nil {
		t.Errorf("socket %s left behind", p.Socket())
	}
}

// TestNodeModeNamesAnUnreachableAPIServer: a node agent whose API server
// refuses connections says so at once, in its log (once, however often
// the informer retries) and in its readiness.
func TestNodeModeNamesAnUnreachableAPIServer(t *testing.T) {
	dir := agentproc.TempDir(t)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := agentproc.Start(t, dir, "MESHAGENT_DEV=true", "MESHAGENT_MODE=node", "NODE_NAME=n1", "KUBECONFIG="+kubeconfig,
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1")
	base := statusBase(t, p)
	waitFor(t, "readiness naming the API server", func() bool {
		code, body := getStatus(t, base+"/healthz/ready")
		return code == 503 && strings.Contains(body, "https://127.0.0.1:1") && strings.Contains(body, "connection refused")
	})
	// The same failure reads the same at every retry, so it is logged once.
	waitFor(t, "the failure logged", func() bool { return strings.Contains(p.Logs(), "cannot list or watch the node's pods") })
	if n := strings.Count(p.Logs(), "cannot list or watch the node's pods"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, p.Logs())
	}
}

// TestConfigFailsWhereRunFails: `meshagent config` runs the checks `run`
// makes: it exits 2 with run's line where run exits 2, and reports the
// source run would pick, dev included.
func TestConfigFailsWhereRunFails(t *testing.T) {
	dir := agentproc.TempDir(t)
	for _, tt := range []struct {
		name, want string
		env        []string
	}{
		{"no POD_NAMESPACE in CA mode", "POD_NAMESPACE is not set", []string{"STATUS_PORT=0", "CA_ROOT_CA=SYSTEM"}},
		{"CA root missing", "CA_ROOT_CA=" + filepath.Join(dir, "nope.pem"), caEnv(dir, "CA_ROOT_CA="+filepath.Join(dir, "nope.pem"))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, cmd := range []string{"config", "run"} {
				code, out := runBinary(t, agentproc.TempDir(t), tt.env, cmd)
				if code != 2 || !strings.Contains(out, tt.want) {
					t.Errorf("%s: exit %d, want 2 with %q:\n%s", cmd, code, tt.want, out)
				}
			}
		})
	}
	for _, env := range [][]string{{"MESHAGENT_DEV=true"}, {}} {
		args := []string{"config"}
		if len(env) == 0 {
			args = append(args, "--dev")
		}
		code, out := runBinary(t, agentproc.TempDir(t), env, args...)
		if code != 0 || !strings.Contains(out, "\nsource: dev (") {
			t.Errorf("config %v %v: exit %d, want 0 and source dev:\n%s", env, args, code, out)
		}
	}
}

// TestUnknownNamesAreWarned: a misspelled MESHAGENT_ variable or
// PROXY_CONFIG field is named, with the nearest known name, by config and
// by run; --dev with FILE_MOUNTED_CERTS=true says which one wins.
func TestUnknownNamesAreWarned(t *testing.T) {
	env := []string{"MESHAGENT_DEV=true", "MESHAGENT_DEVV=true", `PROXY_CONFIG={"discoveryAdress":"istiod.mesh:15012"}`, "FILE_MOUNTED_CERTS=true"}
	want := []string{
		"MESHAGENT_DEVV ignored: no such setting; did you mean MESHAGENT_DEV?",
		"PROXY_CONFIG discoveryAdress ignored: field discoveryAdress is not a field of Istio's ProxyConfig; did you mean discoveryAddress?",
		"FILE_MOUNTED_CERTS=\"true\" has no effect: --dev (MESHAGENT_DEV) comes first",
	}
	code, out := runBinary(t, agentproc.TempDir(t), env, "config")
	if code != 0 {
		t.Fatalf("config exit %d:\n%s", code, out)
	}
	for _, w := range want {
		if !strings.Contains(out, "warning: "+w) {
			t.Errorf("config does not warn %q:\n%s", w, out)
		}
	}
	p := agentproc.Start(t, agentproc.TempDir(t), append(env, "STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1")...)
	statusBase(t, p)
	for _, w := range []string{`"setting":"MESHAGENT_DEVV"`, `did you mean discoveryAddress?`, `"setting":"FILE_MOUNTED_CERTS"`} {
		if !strings.Contains(p.Logs(), w) {
			t.Errorf("run does not log %s:\n%s", w, p.Logs())
		}
	}
}

// TestCommandLineSaysWhatToDo: --version, a stray argument, csi without
// its node, and run --help's value names and defaults.
func TestCommandLineSaysWhatToDo(t *testing.T) {
	dir := agentproc.TempDir(t)
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--version"}, 0, "meshagent "},
		{[]string{"run", "extra"}, 2, `meshagent run takes no arguments, got ["extra"]`},
		{[]string{"config", "extra"}, 2, `meshagent config takes no arguments`},
		{[]string{"csi"}, 2, "--node-id is required"},
		{[]string{"run", "--help"}, 0, "--mode value "},
		{[]string{"run", "--help"}, 0, "--status-port integer"},
		{[]string{"run", "--help"}, 0, "(default ./etc/istio/proxy/XDS)"},
	} {
		code, out := runBinary(t, dir, nil, tt.args...)
		if code != tt.code || !strings.Contains(out, tt.want) {
			t.Errorf("%v: exit %d, want %d with %q:\n%s", tt.args, code, tt.code, tt.want, out)
		}
		if strings.Contains(out, "--mode meshagent") || strings.Contains(out, `unknown command "extra"`) {
			t.Errorf("%v:\n%s", tt.args, out)
		}
	}
}

// TestCompliancePolicyOnTheCAConnection: the built agent with
// COMPLIANCE_POLICY asks no certificate of a CA that offers only what the
// policy disallows (its TLS handshake fails, logged), and gets one from a
// CA that offers what it allows; it logs the policy and the crypto module
// at start.
func TestCompliancePolicyOnTheCAConnection(t *testing.T) {
	for _, tt := range []struct {
		name, policy string
		server       func(*tls.Config)
		ok           bool
	}{
		{"fips-140-2 vs a TLS 1.3-only CA", "fips-140-2", func(c *tls.Config) { c.MinVersion = tls.VersionTLS13 }, false},
		{"fips-140-3 vs a ChaCha20-only CA", "fips-140-3", func(c *tls.Config) {
			c.MaxVersion = tls.VersionTLS12
			c.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256}
		}, false},
		{"pqc vs a classical-only CA", "pqc", func(c *tls.Config) { c.CurvePreferences = []tls.CurveID{tls.X25519, tls.CurveP256} }, false},
		{"fips-140-2 vs a default CA", "fips-140-2", nil, true},
		{"pqc vs a default CA", "pqc", nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{vmToken: vmSA}, ServerTLS: tt.server})
			dir := agentproc.TempDir(t)
			vmWriteToken(t, dir)
			rootPath := filepath.Join(dir, "root-cert.pem")
			flWrite(t, rootPath, ca.RootPEM())
			p := agentproc.Start(t, dir, vmEnv(ca, dir, "CA_ROOT_CA="+rootPath, "COMPLIANCE_POLICY="+tt.policy)...)
			base := statusBase(t, p)
			if !strings.Contains(p.Logs(), `"compliance_policy":"`+tt.policy+`"`) || !strings.Contains(p.Logs(), `"crypto_module":"Go Cryptographic Module`) {
				t.Errorf("the start-up line names no policy or crypto module:\n%s", p.Logs())
			}
			if tt.ok {
				waitFor(t, "ready", func() bool { code, _ := getStatus(t, base+"/healthz/ready"); return code == 200 })
				return
			}
			waitFor(t, "a failed handshake logged", func() bool { return strings.Contains(p.Logs(), "handshake") })
			if code, _ := getStatus(t, base+"/healthz/ready"); code == 200 {
				t.Error("ready with a certificate from a CA the policy disallows")
			}
			if n := ca.Requests(); n != 0 {
				t.Errorf("the CA got %d requests", n)
			}
		})
	}
}

// TestTerminalLogTimesCarryTheDate: on a terminal (a pty made by
// script(1)), the human-readable log writes a certificate's not_after with
// its date, so tomorrow's time does not read as today's past.
func TestTerminalLogTimesCarryTheDate(t *testing.T) {
	heavy.Skip(t, "runs the built agent")
	scriptBin, err := exec.LookPath("script")
	if err != nil {
		t.Skip("script(1), which gives the agent a terminal, is not installed")
	}
	bin, err := agentproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := agentproc.TempDir(t)
	cmd := exec.Command(scriptBin, "-qefc", bin+" run", "/dev/null")
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "TERM=dumb", "MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1"}
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	// The agent runs in script's session: it ignores the SIGHUP script's end
	// sends there, so it is stopped first, found by its working directory.
	stop := func() {
		stopProcessesIn(t, dir)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
	}
	// The first certificate is logged within moments; its line holds the
	// day after tomorrow's date at most (24 h certificates).
	deadline := time.After(15 * time.Second)
	want := regexp.MustCompile(`"not_after": "\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z"`)
	for !want.MatchString(out.String()) {
		select {
		case <-deadline:
			stop()
			t.Fatalf("no not_after with a date in the terminal's log:\n%s", out.String())
		case <-done:
			t.Fatalf("the agent exited:\n%s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if strings.HasPrefix(strings.TrimSpace(out.String()), "{") {
		t.Errorf("JSON on a terminal:\n%s", out.String())
	}
	stop()
}

// stopProcessesIn sends SIGTERM and SIGINT to every process whose working directory is
// dir and waits (up to 10 s) until they are gone.
func stopProcessesIn(t *testing.T, dir string) {
	t.Helper()
	in := func() []int {
		var pids []int
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && cwd == dir {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	for _, pid := range in() {
		// SIGINT after SIGTERM: a stop without the drain.
		_ = syscall.Kill(pid, syscall.SIGTERM)
		_ = syscall.Kill(pid, syscall.SIGINT)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(in()) > 0 {
		if time.Now().After(deadline) {
			t.Errorf("processes still running in %s after SIGTERM: %v", dir, in())
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConfigErrorIsTheFirstLine: a configuration problem is the first line
// the agent writes (the start-up log lines it held follow), exits 2 and
// names the setting: an unwritable GRPC_XDS_BOOTSTRAP (for run and config),
// a KUBECONFIG that is not there, FILE_MOUNTED_CERTS=true without the files.
func TestConfigErrorIsTheFirstLine(t *testing.T) {
	dir := agentproc.TempDir(t)
	for _, tt := range []struct {
		name, setting string
		env           []string
	}{
		{"unwritable gRPC bootstrap", "GRPC_XDS_BOOTSTRAP", []string{"MESHAGENT_DEV=true", "STATUS_PORT=0", "DISABLE_ENVOY=true",
			"OUTPUT_CERTS=" + filepath.Join(dir, "out"), "GRPC_XDS_BOOTSTRAP=/proc/meshagent/grpc-bootstrap.json",
			"MESHAGENT_SDS_SOCKET=" + filepath.Join(dir, "a", "socket")}},
		{"no kubeconfig", "KUBECONFIG", []string{"STATUS_PORT=0", "KUBECONFIG=/nope", "CREDENTIAL_FETCHER_TYPE=TokenRequest",
			"POD_NAME=web-0", "POD_NAMESPACE=shop", "SERVICE_ACCOUNT=web", "CA_ROOT_CA=SYSTEM", "MESHAGENT_SDS_SOCKET=" + filepath.Join(dir, "b", "socket")}},
		{"file-mounted certificates missing", "FILE_MOUNTED_CERTS", []string{"STATUS_PORT=0", "FILE_MOUNTED_CERTS=true",
			"MESHAGENT_SDS_SOCKET=" + filepath.Join(dir, "c", "socket")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, cmd := range []string{"run", "config"} {
				code, out := runBinary(t, agentproc.TempDir(t), tt.env, cmd)
				first, _, _ := strings.Cut(out, "\n")
				if code != 2 {
					t.Errorf("%s: exit %d, want 2:\n%s", cmd, code, out)
				}
				if strings.HasPrefix(first, "{") || !strings.Contains(first, tt.setting) || !strings.Contains(first, "set "+tt.setting) {
					t.Errorf("%s: first line %q does not name %s and what to set:\n%s", cmd, first, tt.setting, out)
				}
			}
		})
	}
}

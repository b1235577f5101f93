package test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/heavy"
)

// The end-to-end tests' proxyless workload (test/e2e/images/xdsecho), run here as the
// e2e cluster runs it, minus the cluster: a server and clients, each a process on the
// bootstrap and OUTPUT_CERTS of an agent of its own (the real binary, DISABLE_ENVOY),
// configured by a go-control-plane server through the agents' xDS proxies with mTLS and
// RBAC (pxResources).

// xeLine is one line xdsecho prints.
type xeLine struct {
	Kind            string `json:"kind"`
	Mode            string `json:"mode"`
	Self            string `json:"self"`
	OK              bool   `json:"ok"`
	Code            string `json:"code"`
	ServerID        string `json:"server_id"`
	ServerSays      string `json:"server_says"`
	ServerSerial    string `json:"server_serial"`
	ServerIssuer    string `json:"server_issuer"`
	ClientID        string `json:"client_id"`
	Calls           int    `json:"calls"`
	Failures        int    `json:"failures"`
	FailuresAfterOK int    `json:"failures_after_ok"`
	Error           string `json:"error"`
}

// xeProc is one xdsecho process.
type xeProc struct {
	name string
	mu   sync.Mutex
	out  bytes.Buffer
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *xeProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *xeProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *xeProc) lines() []xeLine {
	var out []xeLine
	sc := bufio.NewScanner(strings.NewReader(p.output()))
	for sc.Scan() {
		var l xeLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Kind != "" {
			out = append(out, l)
		}
	}
	return out
}

func (p *xeProc) calls() []xeLine {
	var out []xeLine
	for _, l := range p.lines() {
		if l.Kind == "call" {
			out = append(out, l)
		}
	}
	return out
}

func (p *xeProc) alive(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("xdsecho %s exited:\n%s", p.name, p.output())
	default:
	}
}

func buildXdsecho(t *testing.T) string {
	t.Helper()
	heavy.Skip(t, "builds and runs xdsecho")
	bin := filepath.Join(t.TempDir(), "xdsecho")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/meshagent/meshagent/test/e2e/images/xdsecho")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building xdsecho: %v: %s", err, out)
	}
	return bin
}

func startXdsecho(t *testing.T, bin, name, mode string, env ...string) *xeProc {
	t.Helper()
	p := &xeProc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(bin, mode)
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			o := p.output()
			t.Logf("xdsecho %s output (tail):\n%s", name, o[max(0, len(o)-4000):])
		}
	})
	return p
}

// stop sends SIGTERM and waits for the process to exit cleanly.
func (p *xeProc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("xdsecho %s still runs 10 s after SIGTERM", p.name)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("xdsecho %s exited %d after SIGTERM", p.name, code)
	}
}

func TestXdsechoProxylessMTLSAndRBAC(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the agent and xdsecho binaries (-short)")
	}
	echo := buildXdsecho(t)
	m := newPxMesh(t, pxAgentBinary(t), "10.20.0.3")
	xs := m.xs
	serverAgent, clientAgent, otherAgent := m.serverAgent, m.clientAgent, m.otherAgent
	agents := m.agents()
	serverID, clientID, otherID := m.serverID, m.clientID, m.otherID

	// A free port for the server process.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	_ = lis.Close()
	res := pxResources(t, port, serverID, clientID)
	for _, a := range agents {
		if err := xs.SetResources(a.nodeID, "1", res); err != nil {
			t.Fatal(err)
		}
	}

	server := startXdsecho(t, echo, "server", "server", "GRPC_XDS_BOOTSTRAP="+serverAgent.bootstrap, "HOST=127.0.0.1", "PORT="+strconv.Itoa(port))
	testwait.Within(t, 20*time.Second, "the xdsecho server serves", func() bool {
		server.alive(t)
		for _, l := range server.lines() {
			if l.Kind == "serving" && l.Mode == "SERVING" {
				if l.Self != serverID {
					t.Fatalf("the server's own identity %q, want %s", l.Self, serverID)
				}
				return true
			}
		}
		return false
	})

	// The allowed client: every call over mTLS, each side seeing the other's identity.
	target := "xds:///" + pxTargetHost
	client := startXdsecho(t, echo, "client", "client", "GRPC_XDS_BOOTSTRAP="+clientAgent.bootstrap, "TARGET="+target, "INTERVAL=100ms")
	testwait.Within(t, 20*time.Second, "20 calls after the client's first success", func() bool {
		client.alive(t)
		n := 0
		for _, l := range client.calls() {
			if l.OK || n > 0 {
				n++
			}
		}
		return n >= 20
	})
	// The server agent's certificates (rotated every few seconds here) all come from the
	// CA's one issuing key.
	leaf := serverAgent.leaf()
	if leaf == nil {
		t.Fatal("the server agent's OUTPUT_CERTS has no certificate")
	}
	wantIssuer := hex.EncodeToString(leaf.AuthorityKeyId)
	var okCalls int
	started := false
	for _, l := range client.calls() {
		if !l.OK && !started {
			continue // before the xDS resources and certificates are in place
		}
		started = true
		if !l.OK {
			t.Errorf("a call failed after the first success: %s %s", l.Code, l.Error)
			continue
		}
		okCalls++
		if l.ServerID != serverID || l.ServerSays != serverID || l.ClientID != clientID {
			t.Errorf("call: TLS peer %q, server says %q, server saw client %q; want %s, %s, %s", l.ServerID, l.ServerSays, l.ClientID, serverID, serverID, clientID)
		}
		if l.ServerSerial == "" || l.ServerIssuer != wantIssuer {
			t.Errorf("call: server certificate serial %q issuer key %s, want a serial and the agents' issuer %s", l.ServerSerial, l.ServerIssuer, wantIssuer)
		}
		if l.FailuresAfterOK != 0 {
			t.Errorf("failures_after_ok %d with no failed call after the first success", l.FailuresAfterOK)
		}
	}
	t.Logf("allowed client: %d successful calls over mTLS; last line %s", okCalls, lastLine(client.output(), `"kind":"call"`))

	// Another identity: denied by RBAC, counted as failures.
	other := startXdsecho(t, echo, "other", "client", "GRPC_XDS_BOOTSTRAP="+otherAgent.bootstrap, "TARGET="+target, "INTERVAL=100ms")
	var denied xeLine
	testwait.Within(t, 20*time.Second, "the other identity's calls are denied", func() bool {
		other.alive(t)
		for _, l := range other.calls() {
			if l.Code == "PermissionDenied" {
				denied = l
				return true
			}
		}
		return false
	})
	if denied.OK || denied.Failures < 1 || denied.Failures != denied.Calls-countOK(other.calls(), denied.Calls) {
		t.Errorf("a denied call's line: %+v", denied)
	}
	t.Logf("other identity: %s", lastLine(other.output(), `"code":"PermissionDenied"`))
	for _, l := range other.calls() {
		if l.OK {
			t.Errorf("identity %s got through the RBAC policy: %+v", otherID, l)
		}
	}

	client.stop(t)
	other.stop(t)
	server.stop(t)
}

// countOK counts the successful calls among the first n.
func countOK(calls []xeLine, n int) int {
	ok := 0
	for i, l := range calls {
		if i >= n {
			break
		}
		if l.OK {
			ok++
		}
	}
	return ok
}

// lastLine is the last line of out containing s.
func lastLine(out, s string) string {
	lines := strings.Split(out, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return ""
}

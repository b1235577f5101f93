package pilotagent

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/heavy"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/sdsclient"
	"github.com/meshagent/meshagent/test/xdsserver"
)

// standInLine is one line the Envoy stand-in prints.
type standInLine struct {
	Kind      string    `json:"kind"`
	SpiffeID  string    `json:"spiffe_id"`
	Serial    string    `json:"serial"`
	NotAfter  time.Time `json:"not_after"`
	Roots     int       `json:"roots"`
	Type      string    `json:"type"`
	Resources int       `json:"resources"`
	Bootstrap string    `json:"bootstrap"`
	Args      []string  `json:"args"`
	Socket    string    `json:"socket"`
	UID       int       `json:"uid"`
	Message   string    `json:"message"`
	Error     string    `json:"error"`
}

// output collects a process's output.
type output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// standIn returns the stand-in's lines in pilot-agent's output (pilot-agent passes
// Envoy's stdout through).
func (o *output) standIn() []standInLine {
	var out []standInLine
	sc := bufio.NewScanner(strings.NewReader(o.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte(`{"time"`)) {
			continue
		}
		var l standInLine
		if json.Unmarshal(line, &l) == nil && l.Kind != "" {
			out = append(out, l)
		}
	}
	return out
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var lis []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis = append(lis, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range lis {
		_ = l.Close()
	}
	return ports
}

func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}

func httpGet(url string) (int, string) {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPilotAgentFindsMeshagentSocket runs the real pilot-agent, as Istio's injection
// template runs it, in a working directory where meshagent already serves the workload
// socket: pilot-agent must hand that socket to Envoy (here the stand-in), which must get
// meshagent's certificate from it; the CA must see no CSR; and, once the control plane's
// configuration has reached Envoy through pilot-agent's xDS proxy, pilot-agent must
// report ready.
func TestPilotAgentFindsMeshagentSocket(t *testing.T) {
	heavy.Skip(t, "runs the real pilot-agent and meshagent binaries")
	pilotAgent, err := kubeenv.ToolPath("pilot-agent")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := BootstrapTemplate()
	if err != nil {
		t.Fatal(err)
	}
	const (
		ns, sa, pod = "default", "sleep", "sleep-1"
		token       = "token-sleep"
	)
	wantID := "spiffe://cluster.local/ns/" + ns + "/sa/" + sa
	nodeID := "sidecar~127.0.0.1~" + pod + "." + ns + "~" + ns + ".svc.cluster.local"

	// istiod's two halves: the CA, which must see no CSR, and the xDS server, which the
	// xDS proxy reaches over TLS (a certificate for 127.0.0.1 from the same root) with the
	// pod's token.
	ca := istioca.Start(t, istioca.Config{})
	xs := xdsserver.Start(t, xdsserver.Config{CA: ca.CA(), ServerNames: []string{istioca.DefaultServerName}, Tokens: []string{token}})
	if err := xs.SetResources(nodeID, "1", map[resource.Type][]types.Resource{
		resource.ClusterType: {&clusterv3.Cluster{
			Name:                 "outbound|80||echo.default.svc.cluster.local",
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		}},
		resource.ListenerType: {&listenerv3.Listener{
			Name: "virtualOutbound",
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: "0.0.0.0", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 15001},
			}}},
		}},
	}); err != nil {
		t.Fatal(err)
	}

	// The pod's file system, as the image and the injected volumes make it: the image's
	// files owned by root, the volumes writable by the proxy's user (uid 1337, as the
	// injection template runs istio-proxy), the workload socket's directory an emptyDir
	// (0777) that meshagent (root here) serves its socket in.
	dir := agentproc.TempDir(t)
	b, err := os.ReadFile(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	pa, err := os.ReadFile(pilotAgent)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "usr/local/bin/pilot-agent"), pa, 0o755)
	envoy := filepath.Join(dir, "usr/local/bin/envoy")
	if err := BuildStandIn(envoy); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, BootstrapTemplateImagePath), b, 0o644)
	writeFile(t, filepath.Join(dir, "var/run/secrets/istio/root-cert.pem"), ca.RootPEM(), 0o644)
	writeFile(t, filepath.Join(dir, "var/run/secrets/tokens/istio-token"), []byte(token), 0o600)
	for _, d := range []string{"etc/istio/proxy", "var/run/secrets/credential-uds", "var/lib/istio/data", "var/run/secrets/workload-spiffe-uds"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "var/run/secrets/workload-spiffe-uds"), 0o777); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"etc", "etc/istio", "etc/istio/proxy", "var/run/secrets/credential-uds", "var/lib/istio/data", "var/run/secrets/tokens", "var/run/secrets/tokens/istio-token"} {
		if err := os.Chown(filepath.Join(dir, p), ProxyUID, ProxyUID); err != nil {
			t.Fatal(err)
		}
	}

	// meshagent first, serving the workload socket (dev mode: its own CA).
	agent := agentproc.Start(t, dir, "MESHAGENT_DEV=true", "POD_NAMESPACE="+ns, "SERVICE_ACCOUNT="+sa, "POD_NAME="+pod,
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sds, err := sdsclient.Dial(ctx, agent.Socket())
	if err != nil {
		t.Fatalf("meshagent's socket: %v\n%s", err, agent.Logs())
	}
	defer sds.Close()
	stream, err := sds.Stream(ctx, sdsclient.StreamConfig{Names: []string{"default"}})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Next(ctx)
	if err != nil {
		t.Fatalf("meshagent's default secret: %v", err)
	}
	stream.Close()
	chain, _, ok := first.Cert("default")
	if !ok {
		t.Fatal("meshagent answered default without a certificate")
	}
	block, _ := pem.Decode(chain)
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	wantSerial := leaf.SerialNumber.Text(16)

	ports := freePorts(t, 4)
	adminPort, statusPort, envoyStatusPort, promPort := ports[0], ports[1], ports[2], ports[3]
	proxyConfig, _ := json.Marshal(map[string]any{
		"discoveryAddress": xs.Addr(),
		"binaryPath":       envoy,
		"proxyAdminPort":   adminPort,
		"statusPort":       statusPort,
	})
	out := &output{}
	cmd := exec.Command(filepath.Join(dir, "usr/local/bin/pilot-agent"), "proxy", "sidecar", "--domain", ns+".svc.cluster.local",
		"--proxyLogLevel=warning", "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info")
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"POD_NAME=" + pod,
		"POD_NAMESPACE=" + ns,
		"INSTANCE_IP=127.0.0.1",
		"SERVICE_ACCOUNT=" + sa,
		"HOST_IP=127.0.0.1",
		"PILOT_CERT_PROVIDER=istiod",
		"CA_ADDR=" + ca.Addr(),
		"PROXY_CONFIG=" + string(proxyConfig),
		"ISTIO_META_CLUSTER_ID=Kubernetes",
		"ISTIO_META_INTERCEPTION_MODE=REDIRECT",
		"TRUST_DOMAIN=cluster.local",
		"ISTIO_META_MESH_ID=cluster.local",
		"ENVOY_STATUS_PORT=" + strconv.Itoa(envoyStatusPort),
		"ENVOY_PROMETHEUS_PORT=" + strconv.Itoa(promPort),
		"ENVOY_STANDIN_INTERVAL=500ms",
	}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so that the stand-in goes too if pilot-agent does not stop it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: ProxyUID, Gid: ProxyUID}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("pilot-agent output:\n%s", out.String())
		}
	})
	exited := func() {
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("pilot-agent exited: %v", err)
		default:
		}
	}

	// 1. pilot-agent found the socket, made no CA client, and started the stand-in on
	// a bootstrap that names the socket.
	testwait.Within(t, 30*time.Second, "pilot-agent started Envoy", func() bool {
		exited()
		for _, l := range out.standIn() {
			if l.Kind == "start" {
				return true
			}
		}
		return false
	})
	logs := out.String()
	for _, want := range []string{
		"Existing workload SDS socket found at var/run/secrets/workload-spiffe-uds/socket",
		"Skipping connecting to CA",
		"Envoy command: [-c etc/istio/proxy/envoy-rev.json",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("pilot-agent did not log %q", want)
		}
	}
	for _, l := range out.standIn() {
		if l.Kind == "start" && l.Socket != "unix:./var/run/secrets/workload-spiffe-uds/socket" {
			t.Errorf("the bootstrap's sds-grpc cluster is %s, want the workload socket", l.Socket)
		}
		if l.Kind == "start" && l.UID != ProxyUID {
			t.Errorf("Envoy runs as uid %d, want %d (pilot-agent's)", l.UID, ProxyUID)
		}
	}

	// 2. The stand-in got meshagent's certificate and roots over that socket.
	var got standInLine
	testwait.Within(t, 15*time.Second, "the stand-in fetched meshagent's certificate", func() bool {
		exited()
		for _, l := range out.standIn() {
			if l.Kind == "sds" && l.Error == "" {
				got = l
				return true
			}
		}
		return false
	})
	if got.SpiffeID != wantID || got.Serial != wantSerial || got.Roots != 1 {
		t.Errorf("the stand-in got %s serial %s with %d roots, want meshagent's %s serial %s with 1 root", got.SpiffeID, got.Serial, got.Roots, wantID, wantSerial)
	}

	// 3. Ready once the configuration reached Envoy: on the status port, and through the
	// bootstrap's health listener (what the kubelet probes).
	var code int
	var body string
	testwait.Within(t, 30*time.Second, "pilot-agent reports ready", func() bool {
		exited()
		code, body = httpGet(fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", statusPort))
		return code == http.StatusOK
	})
	if code, body = httpGet(fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", envoyStatusPort)); code != http.StatusOK {
		t.Errorf("/healthz/ready through Envoy's health listener: %d %s", code, body)
	}
	if code, body = httpGet(fmt.Sprintf("http://127.0.0.1:%d/stats/prometheus", promPort)); code != http.StatusOK || !strings.Contains(body, "envoy_server_state 0") || strings.Contains(body, "envoy_standin_sds_fetch_success 0\n") {
		t.Errorf("/stats/prometheus through Envoy's Prometheus listener: %d %s", code, body)
	}
	tokens := map[string]bool{}
	for _, c := range xs.Calls() {
		for _, v := range c.Metadata.Get("authorization") {
			tokens[v] = true
		}
	}
	if !tokens["Bearer "+token] {
		t.Errorf("no xDS stream with the pod's token reached the control plane (saw %v)", tokens)
	}

	// 4. The CA never heard from pilot-agent.
	if csrs := ca.CSRs(); len(csrs) != 0 {
		t.Errorf("the CA received %d CSRs, want none: %+v", len(csrs), csrs)
	}

	// 5. SIGTERM: pilot-agent drains Envoy and exits 0.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		stopped = true
		if err != nil {
			t.Errorf("pilot-agent exited with %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("pilot-agent still runs 20 s after SIGTERM")
	}
	// pilot-agent asks Envoy to drain, waits terminationDrainDuration (5 s) and then
	// kills it: Envoy never sees the SIGTERM.
	drained := false
	for _, l := range out.standIn() {
		if l.Kind == "admin" && strings.HasPrefix(l.Message, "drain_listeners") {
			drained = true
		}
	}
	if !drained {
		t.Error("pilot-agent did not ask the stand-in to drain its listeners")
	}
	if agent.ExitCode() != -1 {
		t.Errorf("meshagent exited (%d) while pilot-agent ran", agent.ExitCode())
	}
}

// TestProxyImageLayout builds the istio-proxy image of ProxyImageArgs with tools/image and
// reads it back: the files where pilot-agent looks for them, and the user and entry point
// of the injection template.
func TestProxyImageLayout(t *testing.T) {
	heavy.Skip(t, "builds tools/image")
	tmpl, err := BootstrapTemplate()
	if err != nil {
		t.Fatal(err)
	}
	// The layout is the point: small files stand for the two programs.
	dir := t.TempDir()
	pilotAgent, envoy := filepath.Join(dir, "pilot-agent"), filepath.Join(dir, "envoy")
	writeFile(t, pilotAgent, []byte("pilot-agent program"), 0o755)
	writeFile(t, envoy, []byte("envoy program"), 0o755)
	tool := filepath.Join(dir, "image-tool")
	build := exec.Command("go", "build", "-o", tool, ".")
	build.Dir = filepath.Join(repoRoot(), "tools", "image")
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building tools/image: %v: %s", err, out)
	}
	archive := filepath.Join(dir, "proxy.tar")
	if out, err := exec.Command(tool, ProxyImageArgs(pilotAgent, envoy, tmpl, "meshagent.test/istio-proxy:e2e", archive)...).CombinedOutput(); err != nil {
		t.Fatalf("image-tool: %v: %s", err, out)
	}

	files, config := readArchive(t, archive)
	for name, want := range map[string]struct {
		mode     int64
		uid      int
		fromFile string
	}{
		"usr/local/bin/pilot-agent":                     {0o755, 0, pilotAgent},
		"usr/local/bin/envoy":                           {0o755, 0, envoy},
		"var/lib/istio/envoy/envoy_bootstrap_tmpl.json": {0o644, 0, tmpl},
		"etc/istio/proxy/":                              {0o755, ProxyUID, ""},
		"var/lib/istio/data/":                           {0o755, ProxyUID, ""},
		"var/run/secrets/credential-uds/":               {0o755, ProxyUID, ""},
		"var/run/secrets/workload-spiffe-uds/":          {0o777, ProxyUID, ""},
	} {
		got, ok := files[name]
		if !ok {
			t.Errorf("%s missing from the image", name)
			continue
		}
		if got.Mode != want.mode || got.Uid != want.uid || got.Gid != want.uid {
			t.Errorf("%s: mode %o owner %d:%d, want %o %d:%d", name, got.Mode, got.Uid, got.Gid, want.mode, want.uid, want.uid)
		}
		if want.fromFile != "" {
			if fi, err := os.Stat(want.fromFile); err != nil || fi.Size() != got.Size {
				t.Errorf("%s: %d bytes, want those of %s", name, got.Size, want.fromFile)
			}
		}
	}
	if got := strings.Join(config.Config.Entrypoint, " "); got != "/usr/local/bin/pilot-agent" {
		t.Errorf("entry point %q", got)
	}
	if config.Config.User != "1337:1337" || config.Config.WorkingDir != "/" {
		t.Errorf("user %q working directory %q, want 1337:1337 and /", config.Config.User, config.Config.WorkingDir)
	}
}

type imageConfig struct {
	Config struct {
		Entrypoint []string
		User       string
		WorkingDir string
	} `json:"config"`
}

// readArchive reads a docker-save archive of one image: its layers' entries (later
// layers win) and its config.
func readArchive(t *testing.T, archive string) (map[string]*tar.Header, imageConfig) {
	t.Helper()
	members := map[string][]byte{}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		members[h.Name] = b
	}
	var manifest []struct {
		Config string
		Layers []string
	}
	if err := json.Unmarshal(members["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v (%d images)", err, len(manifest))
	}
	var cfg imageConfig
	if err := json.Unmarshal(members[manifest[0].Config], &cfg); err != nil {
		t.Fatalf("config: %v", err)
	}
	files := map[string]*tar.Header{}
	for _, l := range manifest[0].Layers {
		var r io.Reader = bytes.NewReader(members[l])
		if zr, err := gzip.NewReader(r); err == nil {
			r = zr
		} else {
			r = bytes.NewReader(members[l])
		}
		lr := tar.NewReader(r)
		for {
			h, err := lr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("layer %s: %v", l, err)
			}
			files[h.Name] = h
		}
	}
	return files, cfg
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/app"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/test/podproc"
)

func TestMain(m *testing.M) {
	podproc.RunFetchChild()
	os.Exit(kube.Main(m))
}

// runCmd runs the CLI in-process in a fresh working directory.
func runCmd(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, env, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestConfigPrintsEverySettingWithItsSource(t *testing.T) {
	t.Chdir(t.TempDir())
	env := []string{"TRUST_DOMAIN=example.org", "CA_HEADER_x-tenant=blue", "PATH=/usr/bin"}
	code, out, errOut := runCmd(t, env, "config", "--ca-addr", "ca.example:443", "--dev")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	fields := map[string][]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) >= 3 {
			fields[f[0]] = f
		}
	}
	for _, s := range settings.Registry {
		if _, ok := fields[s.Name]; !ok {
			t.Errorf("setting %s missing from config output", s.Name)
		}
	}
	for name, want := range map[string][2]string{
		"CA_ADDR":          {"ca.example:443", "flag"},
		"MESHAGENT_DEV":    {"true", "flag"},
		"TRUST_DOMAIN":     {"example.org", "env"},
		"CA_HEADER_<NAME>": {"x-tenant=<redacted>", "env"},
		"SECRET_TTL":       {"24h0m0s", "default"},
		"CA_PROVIDER":      {"Citadel", "default"},
	} {
		f := fields[name]
		if len(f) < 3 || f[1] != want[0] || f[2] != want[1] {
			t.Errorf("%s: got %v, want value %q source %q", name, f, want[0], want[1])
		}
	}
	if strings.Contains(out, "blue") {
		t.Error("a header value was printed")
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "source: dev (") {
		t.Errorf("last line %q, want the certificate source", last)
	}
}

func TestConfigJSON(t *testing.T) {
	t.Chdir(t.TempDir())
	code, out, errOut := runCmd(t, []string{"CA_PROVIDER=Linkerd", "POD_NAMESPACE=shop", "SERVICE_ACCOUNT=web", "CA_ROOT_CA=SYSTEM"}, "config", "-o", "json", "--log-level=debug")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep configReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(rep.Settings) != len(settings.Registry) {
		t.Errorf("%d settings, want %d", len(rep.Settings), len(settings.Registry))
	}
	sources := map[string]settings.Source{}
	for _, r := range rep.Settings {
		sources[r.Name] = r.Source
		if r.Doc == "" {
			t.Errorf("%s has no doc", r.Name)
		}
	}
	if sources["CA_PROVIDER"] != settings.SourceEnv || sources["MESHAGENT_LOG_LEVEL"] != settings.SourceFlag || sources["SECRET_TTL"] != settings.SourceDefault {
		t.Errorf("sources %v", sources)
	}
	if rep.Source.Source != app.SourceCA || rep.Source.Provider != "Linkerd" || !strings.Contains(rep.Source.Reason, "linkerd-identity.linkerd.svc.cluster.local:8080") {
		t.Errorf("source %+v", rep.Source)
	}
	if rep.Mode != rep.Source {
		t.Errorf("the deprecated alias mode is %+v, want the source %+v", rep.Mode, rep.Source)
	}
	// The decision itself names the source "source" and, deprecated, "mode".
	var raw struct {
		Source map[string]any `json:"source"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil || raw.Source["source"] != "ca" || raw.Source["mode"] != "ca" {
		t.Errorf("source object %v (%v), want source and mode ca", raw.Source, err)
	}
}

func TestInvalidSettingExits2WithOneLine(t *testing.T) {
	t.Chdir(t.TempDir())
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"run env", []string{"CA_PROVIDER=Bogus"}, []string{"run"}, `invalid CA_PROVIDER="Bogus": accepted: Citadel, Linkerd`},
		{"run flag", nil, []string{"run", "--ca-provider=Bogus"}, `invalid --ca-provider="Bogus": accepted: Citadel, Linkerd`},
		{"config env", []string{"SECRET_TTL=soon"}, []string{"config"}, `invalid SECRET_TTL="soon": want a duration such as 100ms, 90s or 24h`},
		{"bad json", []string{"PROXY_CONFIG={"}, []string{"run"}, `invalid PROXY_CONFIG="{": not valid JSON: unexpected end of JSON input`},
		{"bad output", nil, []string{"config", "-o", "yaml"}, `invalid --output="yaml": accepted: text, json`},
		{"unknown flag", nil, []string{"run", "--bogus"}, `unknown flag: --bogus`},
		{"bool flag", nil, []string{"run", "--dev=maybe"}, `invalid --dev="maybe": accepted: true or false`},
		{"identity", []string{"SERVICE_ACCOUNT=web"}, []string{"run"}, `POD_NAMESPACE is not set: it names the workload identity`},
		{"unknown command", nil, []string{"serve"}, `meshagent: unknown command "serve" for "meshagent"`},
		{"no root for none", []string{"PILOT_CERT_PROVIDER=none"}, []string{"run"}, `invalid PILOT_CERT_PROVIDER="none": no default CA root: set CA_ROOT_CA (a path, or SYSTEM) or PROV_CERT`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCmd(t, tt.env, tt.args...)
			if code != exitConfig {
				t.Errorf("exit %d, want 2", code)
			}
			if out != "" {
				t.Errorf("stdout %q", out)
			}
			if tt.name == "identity" {
				// Reported after logging starts: the log line carries it.
				if !strings.Contains(errOut, tt.want) {
					t.Errorf("stderr %q lacks %q", errOut, tt.want)
				}
				return
			}
			if errOut != tt.want+"\n" {
				t.Errorf("stderr %q, want %q", errOut, tt.want+"\n")
			}
		})
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runCmd(t, nil, "version")
	if code != exitOK || !strings.HasPrefix(out, "meshagent dev (go") {
		t.Errorf("%d %q", code, out)
	}
}

// TestVersionFlag: --version and -v print what `meshagent version` prints;
// the root alone prints its help.
func TestVersionFlag(t *testing.T) {
	for _, arg := range []string{"--version", "-v"} {
		code, out, _ := runCmd(t, nil, arg)
		if code != exitOK || out != versionString()+"\n" {
			t.Errorf("%s: %d %q", arg, code, out)
		}
	}
	code, out, _ := runCmd(t, nil)
	if code != exitOK || !strings.Contains(out, "Usage:") || !strings.Contains(out, "run ") {
		t.Errorf("no arguments: %d %q", code, out)
	}
}

func TestDocsCommandWritesTheReference(t *testing.T) {
	path := t.TempDir() + "/configuration.md"
	if code, _, errOut := runCmd(t, nil, "docs", "-o", path); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, committed) {
		t.Error("docs/configuration.md differs from `meshagent docs`: run make docs")
	}
}

// startAgent runs `meshagent run args...` in-process and returns the status
// server's base URL and a function that waits for the exit code.
func startAgent(t *testing.T, ctx context.Context, env []string, args ...string) (string, func() int, *syncBuffer) {
	t.Helper()
	addrs := make(chan net.Addr, 1)
	stderr := &syncBuffer{}
	codes := make(chan int, 1)
	go func() {
		codes <- execute(ctx, append([]string{"run"}, args...), env, io.Discard, stderr,
			hooks{statusListening: func(a net.Addr) { addrs <- a }})
	}()
	wait := func() int {
		select {
		case c := <-codes:
			return c
		case <-time.After(15 * time.Second):
			t.Fatalf("agent did not stop; log:\n%s", stderr)
			return -1
		}
	}
	select {
	case a := <-addrs:
		return "http://" + a.String(), wait, stderr
	case c := <-codes:
		t.Fatalf("agent exited with %d before serving status; log:\n%s", c, stderr)
	case <-time.After(15 * time.Second):
		t.Fatalf("status server did not start; log:\n%s", stderr)
	}
	return "", nil, nil
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitReady polls /healthz/ready until it answers 200 (the first certificate
// is held) or 10 s pass, and returns the last answer.
func waitReady(t *testing.T, base string) (int, string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := httpGet(t, base+"/healthz/ready")
		if code == 200 || time.Now().After(deadline) {
			return code, body
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRunDevServesStatusAndStopsOnCancel(t *testing.T) {
	t.Chdir(t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, wait, log := startAgent(t, ctx, []string{"STATUS_PORT=0"}, "--dev", "--status-host=127.0.0.1")
	if code, body := httpGet(t, base+"/healthz/live"); code != 200 {
		t.Errorf("live: %d %q", code, body)
	}
	if code, body := waitReady(t, base); code != 200 {
		t.Errorf("ready: %d %q", code, body)
	}
	if code, body := httpGet(t, base+"/debug/certs"); code != 200 || !strings.Contains(body, `"source": "dev-ca"`) {
		t.Errorf("certs: %d %q", code, body)
	}
	if code, body := httpGet(t, base+"/metrics"); code != 200 || !strings.Contains(body, `meshagent_agent_info{mode="sidecar",source="dev"`) {
		t.Errorf("metrics: %d", code)
	}
	cancel()
	if code := wait(); code != exitOK {
		t.Errorf("exit %d; log:\n%s", code, log)
	}
	if !strings.Contains(log.String(), "not for production") {
		t.Errorf("no production warning in the log:\n%s", log)
	}
}

func TestRunStopsOnQuitQuitQuit(t *testing.T) {
	t.Chdir(t.TempDir())
	base, wait, log := startAgent(t, context.Background(), []string{"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", "MESHAGENT_DEV=true"})
	quit(t, base)
	if code := wait(); code != exitOK {
		t.Errorf("exit %d; log:\n%s", code, log)
	}
}

func TestRunFailsWhenStatusPortIsTaken(t *testing.T) {
	t.Chdir(t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--dev", "--status-host=127.0.0.1", "--status-port=" + port}, nil, io.Discard, &stderr)
	if code != exitFailure || !strings.Contains(stderr.String(), "address already in use") {
		t.Errorf("exit %d; log:\n%s", code, stderr.String())
	}
}

func TestRunCAModeNeedsTheCARoot(t *testing.T) {
	t.Chdir(t.TempDir())
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"run"}, []string{"POD_NAMESPACE=a", "SERVICE_ACCOUNT=b", "STATUS_PORT=0"}, io.Discard, &stderr)
	if code != exitConfig || !strings.Contains(stderr.String(), "CA_ROOT_CA=./var/run/secrets/istio/root-cert.pem (the default) cannot be used") {
		t.Errorf("exit %d; log:\n%s", code, stderr.String())
	}
}

func quit(t *testing.T, base string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Post(base+"/quitquitquit", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("quit: %d", resp.StatusCode)
	}
}

func TestSettingsWithoutEffectAreWarnedAtStartUp(t *testing.T) {
	t.Chdir(t.TempDir())
	env := []string{"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", "CREDENTIAL_FETCHER_TYPE=JWT",
		"CREDENTIAL_IDENTITY_PROVIDER=istio-ca", "PILOT_CERT_PROVIDER=kubernetes", "MESHAGENT_TOKEN_LIFETIME=2h"}
	want := []string{"PILOT_CERT_PROVIDER", "CREDENTIAL_IDENTITY_PROVIDER", "MESHAGENT_TOKEN_LIFETIME"} // registry order

	code, out, errOut := runCmd(t, env, "config", "--dev")
	if code != exitOK {
		t.Fatalf("config: exit %d: %s", code, errOut)
	}
	for _, name := range want {
		if !strings.Contains(out, "warning: "+name+"=") {
			t.Errorf("config output lacks a warning for %s:\n%s", name, out)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, wait, log := startAgent(t, ctx, env, "--dev")
	cancel()
	if code := wait(); code != exitOK {
		t.Fatalf("exit %d; log:\n%s", code, log)
	}
	var warned []string
	for _, line := range strings.Split(log.String(), "\n") {
		if !strings.Contains(line, "setting has no effect") {
			continue
		}
		for _, name := range want {
			if strings.Contains(line, `"setting":"`+name+`"`) {
				warned = append(warned, name)
			}
		}
	}
	if !slices.Equal(warned, want) {
		t.Errorf("start-up warnings for %v, want %v; log:\n%s", warned, want, log)
	}
}

func TestRunWritesTheSidecarNodeID(t *testing.T) {
	t.Chdir(t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := []string{"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", "DISABLE_ENVOY=true", "OUTPUT_CERTS=out",
		"INSTANCE_IP=10.9.8.7", "POD_NAME=web-0", "POD_NAMESPACE=shop", "SERVICE_ACCOUNT=web", "TRUST_DOMAIN=example.org"}
	base, wait, log := startAgent(t, ctx, env, "--dev")
	if code, body := waitReady(t, base); code != 200 {
		t.Fatalf("ready: %d %q", code, body)
	}
	var bs struct {
		Node struct {
			ID string `json:"id"`
		} `json:"node"`
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile("etc/istio/proxy/grpc-bootstrap.json")
		if err == nil {
			if err := json.Unmarshal(b, &bs); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no bootstrap written: %v; log:\n%s", err, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The DNS domain is the namespace's service domain in cluster.local,
	// whatever the trust domain.
	if want := "sidecar~10.9.8.7~web-0.shop~shop.svc.cluster.local"; bs.Node.ID != want {
		t.Errorf("node ID %q, want %q", bs.Node.ID, want)
	}
	cancel()
	if code := wait(); code != exitOK {
		t.Errorf("exit %d; log:\n%s", code, log)
	}
}

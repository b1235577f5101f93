package app

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/settings"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// running is an App started by startApp.
type running struct {
	app    *App
	logs   *observer.ObservedLogs
	status string // the status server's base URL
	done   chan error
	cancel context.CancelFunc
}

// startApp makes the App of s (cfg's other fields as given; Settings and
// a logger are filled in), runs it, and waits until its status server
// listens. The App is stopped at the end of the test.
func startApp(t *testing.T, cfg Config, s *settings.Config) *running {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	addrs := make(chan net.Addr, 1)
	cfg.Settings, cfg.Logger = s, zap.New(core)
	onListen := cfg.OnStatusListen
	cfg.OnStatusListen = func(a net.Addr) {
		if onListen != nil {
			onListen(a)
		}
		addrs <- a
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{app: a, logs: logs, done: make(chan error, 1), cancel: cancel}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	select {
	case addr := <-addrs:
		r.status = "http://" + addr.String()
	case err := <-r.done:
		t.Fatalf("Run returned %v before the status server listened", err)
	case <-time.After(15 * time.Second):
		t.Fatal("the status server did not start")
	}
	return r
}

// stop cancels Run and checks that it returns nil; a second call does
// nothing.
func (r *running) stop(t *testing.T) {
	t.Helper()
	if r.done == nil {
		return
	}
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	r.done = nil
}

// waitReady polls /healthz/ready until it answers 200 (the first
// certificate is held) or 10 s pass.
func (r *running) waitReady(t *testing.T) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := c.Get(r.status + "/healthz/ready")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %d %s", resp.StatusCode, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// caSettings is a configuration that asks a CA at caAddr, with every path
// under dir.
func caSettings(t *testing.T, dir, caAddr string, env ...string) *settings.Config {
	t.Helper()
	ca, err := localca.New(localca.Config{Name: "app test root"})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root-cert.pem")
	token := filepath.Join(dir, "token")
	for path, b := range map[string][]byte{root: ca.RootPEM(), token: []byte("token")} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return sourceConfig(t, dir, append(env,
		"POD_NAMESPACE=shop", "SERVICE_ACCOUNT=web", "CA_ADDR="+caAddr, "CA_ROOT_CA="+root,
		"MESHAGENT_TOKEN_PATH="+token, "MESHAGENT_XDS_PROXY=false")...)
}

// TestNewStartsNothing: New makes no goroutine, socket or connection, and
// Run does (so the first half of the test can fail).
func TestNewStartsNothing(t *testing.T) {
	dir := t.TempDir()
	ca, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	var dialled atomic.Int32
	accepted := make(chan struct{})
	go func() {
		for {
			c, err := ca.Accept()
			if err != nil {
				return
			}
			if dialled.Add(1) == 1 {
				close(accepted)
			}
			c.Close()
		}
	}()
	s := caSettings(t, dir, ca.Addr().String())

	before := goleak.IgnoreCurrent()
	a, err := New(Config{Settings: s})
	if err != nil {
		t.Fatal(err)
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("New left goroutines running: %v", err)
	}
	if _, err := os.Lstat(filepath.Dir(s.SDSSocket)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("New made the socket's directory (%v)", err)
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("New connected to the CA %d times", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-accepted:
	case <-time.After(10 * time.Second):
		t.Error("Run did not connect to the CA")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := a.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run: %v, want ErrRunning", err)
	}
}

// TestNewRefusesBadConfiguration: each configuration that cannot work is a
// ConfigError naming the setting, returned before anything is built or
// started (the CA is never dialled, no goroutine is left). What the settings
// alone rule out, settings.Resolve refuses (its TestInvalidCombinations).
func TestNewRefusesBadConfiguration(t *testing.T) {
	ca, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"token request without a pod", []string{"CREDENTIAL_FETCHER_TYPE=TokenRequest"}, "CREDENTIAL_FETCHER_TYPE=TokenRequest needs POD_NAME"},
		{"no service account", []string{"SERVICE_ACCOUNT="}, "SERVICE_ACCOUNT is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := caSettings(t, t.TempDir(), ca.Addr().String(), tt.env...)
			before := goleak.IgnoreCurrent()
			_, err := New(Config{Settings: s})
			var ce ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: %v, want a ConfigError saying %q", err, tt.want)
			}
			if err := goleak.Find(before); err != nil {
				t.Errorf("a refused New left goroutines running: %v", err)
			}
		})
	}
}

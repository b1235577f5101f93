package status

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs a server on 127.0.0.1:0 and returns its base URL and Run's result.
func start(t *testing.T, cfg Config) (*Server, string, func() error, context.CancelFunc) {
	t.Helper()
	addrs := make(chan net.Addr, 1)
	cfg.Addr = "127.0.0.1:0"
	cfg.OnListen = func(a net.Addr) { addrs <- a }
	s := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	stopped := make(chan struct{})
	go func() { runErr = s.Run(ctx); close(stopped) }()
	// wait returns Run's result, or fails the test if Run does not return.
	wait := func() error {
		select {
		case <-stopped:
			return runErr
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return")
			return nil
		}
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	})
	select {
	case a := <-addrs:
		return s, "http://" + a.String(), wait, cancel
	case <-stopped:
		t.Fatalf("Run: %v", runErr)
	case <-time.After(10 * time.Second):
		t.Fatal("server did not listen")
	}
	return nil, "", nil, nil
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestReadiness(t *testing.T) {
	s, base, _, _ := start(t, Config{})
	if code, body := get(t, base+"/healthz/ready"); code != 503 || !strings.Contains(body, "no readiness checks") {
		t.Errorf("no checks: %d %q", code, body)
	}
	var certErr atomic.Pointer[error]
	noCert := errors.New("no workload certificate yet")
	certErr.Store(&noCert)
	s.AddReadiness("workload_certificate", func() error { return *certErr.Load() })
	s.AddReadiness("xds", func() error { return nil })
	code, body := get(t, base+"/healthz/ready")
	if code != 503 || body != "not ready\nworkload_certificate: no workload certificate yet\n" {
		t.Errorf("failing check: %d %q", code, body)
	}
	var ok error
	certErr.Store(&ok)
	if code, body := get(t, base+"/healthz/ready"); code != 200 || body != "ready\n" {
		t.Errorf("passing checks: %d %q", code, body)
	}
}

// TestStartedLeavesOutTheWorkloadsChecks: a native sidecar's workload starts
// once /healthz/started passes, and only it can make the xDS proxy's check
// pass, so /healthz/started must not wait for that check where
// /healthz/ready does.
func TestStartedLeavesOutTheWorkloadsChecks(t *testing.T) {
	s, base, _, _ := start(t, Config{})
	if code, body := get(t, base+"/healthz/started"); code != 503 || !strings.Contains(body, "no readiness checks") {
		t.Errorf("no checks: %d %q", code, body)
	}
	var certOK atomic.Bool
	s.AddReadiness("workload_certificate", func() error {
		if !certOK.Load() {
			return errors.New("no workload certificate yet")
		}
		return nil
	})
	s.AddWorkloadReadiness("xds_upstream", func() error { return errors.New("no stream answered yet") })
	if code, body := get(t, base+"/healthz/started"); code != 503 || body != "not started\nworkload_certificate: no workload certificate yet\n" {
		t.Errorf("no certificate: %d %q", code, body)
	}
	certOK.Store(true)
	if code, body := get(t, base+"/healthz/started"); code != 200 || body != "started\n" {
		t.Errorf("certificate held, no stream: %d %q, want started", code, body)
	}
	if code, body := get(t, base+"/healthz/ready"); code != 503 || body != "not ready\nxds_upstream: no stream answered yet\n" {
		t.Errorf("ready without a stream: %d %q, want the xds_upstream check failing", code, body)
	}
}

func TestLiveness(t *testing.T) {
	s, base, _, _ := start(t, Config{})
	if code, _ := get(t, base+"/healthz/live"); code != 200 {
		t.Errorf("no checks: %d", code)
	}
	var expired atomic.Bool
	s.AddLiveness("workload_certificate", func() error {
		if expired.Load() {
			return errors.New("certificate expired at 2026-01-01T00:00:00Z")
		}
		return nil
	})
	if code, _ := get(t, base+"/healthz/live"); code != 200 {
		t.Errorf("valid cert: %d", code)
	}
	expired.Store(true)
	if code, body := get(t, base+"/healthz/live"); code != 503 || !strings.Contains(body, "workload_certificate: certificate expired") {
		t.Errorf("expired cert: %d %q", code, body)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "meshagent_test_events_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	_, base, _, _ := start(t, Config{Gatherer: reg})
	code, body := get(t, base+"/metrics")
	if code != 200 || !strings.Contains(body, "meshagent_test_events_total 3") {
		t.Errorf("%d %q", code, body)
	}
}

type certList []CertInfo

func (l certList) Certs() []CertInfo { return l }

func TestDebugCerts(t *testing.T) {
	s, base, _, _ := start(t, Config{})
	if code, body := get(t, base+"/debug/certs"); code != 200 || strings.TrimSpace(body) != "[]" {
		t.Errorf("empty: %d %q", code, body)
	}
	nb := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	s.AddCertLister(certList{{Cert: Cert{ResourceName: "default", Identity: "spiffe://cluster.local/ns/a/sa/b", Serial: "0a", NotBefore: nb, NotAfter: nb.Add(24 * time.Hour), RenewAt: nb.Add(12 * time.Hour), Source: "ca"}}})
	s.AddCertLister(certList{{Cert: Cert{ResourceName: "ROOTCA", Serial: "01", NotBefore: nb, NotAfter: nb.Add(time.Hour), Source: "file"}}})
	code, body := get(t, base+"/debug/certs")
	if code != 200 {
		t.Fatalf("%d %q", code, body)
	}
	var raw []map[string]any
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatalf("%v: %q", err, body)
	}
	if len(raw) != 2 || raw[0]["resource_name"] != "ROOTCA" || raw[1]["resource_name"] != "default" {
		t.Fatalf("order/content: %q", body)
	}
	if _, has := raw[0]["renew_at"]; has {
		t.Error("zero renew_at not omitted")
	}
	for _, k := range []string{"identity", "serial", "not_before", "not_after", "renew_at", "source", "resource_name"} {
		if _, has := raw[1][k]; !has {
			t.Errorf("field %s missing", k)
		}
	}
	if raw[1]["renew_at"] != "2026-11-21T22:00:00Z" || raw[1]["identity"] != "spiffe://cluster.local/ns/a/sa/b" {
		t.Errorf("values: %v", raw[1])
	}
}

func TestLoopbackOnlyEndpoints(t *testing.T) {
	s := New(Config{})
	tests := []struct {
		method, path, remote string
		want                 int
	}{
		{"GET", "/debug/pprof/", "10.1.2.3:5555", http.StatusForbidden},
		{"GET", "/debug/pprof/cmdline", "192.168.0.9:1", http.StatusForbidden},
		{"POST", "/quitquitquit", "10.1.2.3:5555", http.StatusForbidden},
		{"POST", "/quitquitquit", "[2001:db8::1]:80", http.StatusForbidden},
		{"POST", "/quitquitquit", "not-an-address", http.StatusForbidden},
		{"GET", "/debug/pprof/", "127.0.0.1:5555", http.StatusOK},
		{"GET", "/debug/pprof/cmdline", "[::1]:5555", http.StatusOK},
		{"GET", "/debug/pprof/cmdline", "[::ffff:127.0.0.1]:5555", http.StatusOK},
		{"GET", "/quitquitquit", "127.0.0.1:5555", http.StatusMethodNotAllowed},
		{"GET", "/healthz/live", "10.1.2.3:5555", http.StatusOK},
		{"GET", "/debug/certs", "10.1.2.3:5555", http.StatusForbidden},
		{"GET", "/debug/certs", "[::1]:5555", http.StatusOK},
		{"GET", "/metrics", "10.1.2.3:5555", http.StatusOK},
		{"POST", "/healthz/ready", "127.0.0.1:5555", http.StatusMethodNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.method+tt.path+" from "+tt.remote, func(t *testing.T) {
			r := httptest.NewRequest(tt.method, tt.path, nil)
			r.RemoteAddr = tt.remote
			w := httptest.NewRecorder()
			s.handler.ServeHTTP(w, r)
			if w.Code != tt.want {
				t.Errorf("got %d, want %d: %q", w.Code, tt.want, w.Body.String())
			}
		})
	}
	select {
	case <-s.quit:
		t.Error("a refused quit request quit the server")
	default:
	}
}

func TestQuitQuitQuitStopsRun(t *testing.T) {
	_, base, wait, _ := start(t, Config{})
	if code, body := get(t, base+"/debug/pprof/cmdline"); code != 200 || body == "" {
		t.Errorf("pprof from loopback: %d", code)
	}
	resp, err := http.Post(base+"/quitquitquit", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("quit: %d", resp.StatusCode)
	}
	if err := wait(); err != nil {
		t.Errorf("Run returned %v, want nil", err)
	}
	if _, err := http.Get(base + "/healthz/live"); err == nil {
		t.Error("server still answering after quit")
	}
}

func TestContextCancelStopsRun(t *testing.T) {
	_, _, wait, cancel := start(t, Config{})
	cancel()
	if err := wait(); err != nil {
		t.Errorf("Run returned %v", err)
	}
}

func TestListenFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = New(Config{Addr: ln.Addr().String()}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("Run on a busy port: %v", err)
	}
}

// Checks and certificate listers added while requests are served are seen
// whole: each answer reflects some prefix of the additions (readiness goes
// from "none registered" to ready and never back, the certificate list
// only grows, by whole listers), and once the additions are done every one
// of them counts.
func TestChecksAddedWhileServing(t *testing.T) {
	const adds = 50
	s, base, _, _ := start(t, Config{})
	lister := certList{{Cert: Cert{ResourceName: "default", Serial: "0a"}}, {Cert: Cert{ResourceName: "ROOTCA", Serial: "01"}}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range adds {
			s.AddReadiness("c", func() error { return nil })
			s.AddLiveness("c", func() error { return nil })
			s.AddCertLister(lister)
		}
	}()
	certs := func() int {
		t.Helper()
		code, body := get(t, base+"/debug/certs")
		var got []CertInfo
		if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil {
			t.Fatalf("/debug/certs: %d %v %q", code, err, body)
		}
		return len(got)
	}
	wasReady, lastCerts := false, 0
	for range 20 {
		code, body := get(t, base+"/healthz/ready")
		switch {
		case code == 200 && body == "ready\n":
			wasReady = true
		case code == 503 && strings.Contains(body, "no readiness checks registered") && !wasReady:
		default:
			t.Fatalf("ready answered %d %q (ready before: %v)", code, body, wasReady)
		}
		n := certs()
		if n < lastCerts || n%len(lister) != 0 || n > adds*len(lister) {
			t.Fatalf("/debug/certs lists %d certificates after %d", n, lastCerts)
		}
		lastCerts = n
	}
	<-done
	if code, body := get(t, base+"/healthz/ready"); code != 200 {
		t.Fatalf("ready after the additions: %d %q", code, body)
	}
	if code, body := get(t, base+"/healthz/live"); code != 200 {
		t.Fatalf("live after the additions: %d %q", code, body)
	}
	if got, live := len(s.checks(false)), len(s.checks(true)); got != adds || live != adds {
		t.Fatalf("%d readiness and %d liveness checks, want %d of each", got, live, adds)
	}
	if n := certs(); n != adds*len(lister) {
		t.Fatalf("/debug/certs lists %d certificates, want %d", n, adds*len(lister))
	}
}

// The listen address has no default of its own (STATUS_PORT's is the
// registry's): a server without one fails at Run, listening nowhere.
func TestRunNeedsAnAddress(t *testing.T) {
	if err := New(Config{}).Run(context.Background()); err == nil || !strings.Contains(err.Error(), "Config.Addr") {
		t.Fatalf("Run without an address = %v, want an error naming Config.Addr", err)
	}
}

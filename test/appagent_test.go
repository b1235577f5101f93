package test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/internal/app"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/status"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// appAgent is the agent as cmd/agent runs it (internal/app, from settings
// resolved like the environment's), with its paths in temporary directories,
// on a fake clock unless asked otherwise, until the test ends.
type appAgent struct {
	t      testing.TB
	app    *app.App
	clock  *clocktesting.FakeClock // nil on the real clock
	reg    *prometheus.Registry
	logs   *observer.ObservedLogs // nil with quietLogs
	socket string
	status string // the status server's base URL
	// dirs are the agent's own directories.
	dirs   []string
	cancel context.CancelFunc
	done   chan error
}

type appOpts struct {
	// env are settings as environment variables; they win over the
	// defaults startApp sets (the first occurrence of a name wins).
	env []string
	// clock is the fake clock to use; nil means a new one at the current
	// whole second, unless realClock.
	clock     *clocktesting.FakeClock
	realClock bool
	quietLogs bool
}

// shortTempDir is a directory short enough for a Unix socket address in it.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// startApp makes and runs the agent of o, and waits until its status server
// listens.
func startApp(t testing.TB, o appOpts) *appAgent {
	t.Helper()
	dir := shortTempDir(t)
	a := &appAgent{t: t, reg: prometheus.NewRegistry(), socket: filepath.Join(dir, "uds", "socket"), dirs: []string{dir}}
	env := append(append([]string(nil), o.env...),
		"MESHAGENT_SDS_SOCKET="+a.socket,
		"MESHAGENT_WORKLOAD_CREDENTIALS_DIR="+filepath.Join(dir, "creds"),
		"MESHAGENT_FILE_MOUNTED_CERTS_DIR="+filepath.Join(dir, "certs"),
		"MESHAGENT_XDS_SOCKET="+filepath.Join(dir, "xds"),
		"MESHAGENT_XDS_PROXY=false",
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1",
	)
	s, err := settings.Resolve(settings.Input{Env: env})
	if err != nil {
		t.Fatal(err)
	}
	cfg := app.Config{Settings: s, Registry: a.reg}
	if !o.realClock {
		a.clock = o.clock
		if a.clock == nil {
			// A whole second, so x509's second-granular NotAfter gives an exact life.
			a.clock = clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
		}
		cfg.Clock = a.clock
	}
	if o.quietLogs {
		cfg.Logger = zap.NewNop()
	} else {
		core, logs := observer.New(zapcore.InfoLevel)
		cfg.Logger, a.logs = zap.New(core), logs
	}
	addrs := make(chan net.Addr, 1)
	cfg.OnStatusListen = func(addr net.Addr) { addrs <- addr }
	a.app, err = app.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel, a.done = cancel, make(chan error, 1)
	go func() { a.done <- a.app.Run(ctx) }()
	t.Cleanup(a.stop)
	select {
	case addr := <-addrs:
		a.status = "http://" + addr.String()
	case err := <-a.done:
		a.done = nil
		t.Fatalf("the agent stopped before its status server listened: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("the agent's status server did not start")
	}
	return a
}

// stop stops the agent and checks that it stopped cleanly; a second call
// does nothing.
func (a *appAgent) stop() {
	a.t.Helper()
	if a.done == nil {
		return
	}
	a.cancel()
	select {
	case err := <-a.done:
		if err != nil {
			a.t.Errorf("the agent stopped with %v", err)
		}
	case <-time.After(15 * time.Second):
		a.t.Error("the agent did not stop")
	}
	a.done = nil
}

// health returns the status code of the status server's /healthz/<what>.
func (a *appAgent) health(what string) int {
	a.t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(a.status + "/healthz/" + what)
	if err != nil {
		a.t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// workloadCert is the workload certificate the agent holds now, as its
// status server lists it (/debug/certs).
func (a *appAgent) workloadCert() status.CertInfo {
	a.t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(a.status + "/debug/certs")
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	var certs []status.CertInfo
	if err := json.NewDecoder(resp.Body).Decode(&certs); err != nil {
		a.t.Fatal(err)
	}
	for _, c := range certs {
		if c.ResourceName == "default" {
			return c
		}
	}
	a.t.Fatalf("no workload certificate in /debug/certs: %+v", certs)
	return status.CertInfo{}
}

// waitHealth polls /healthz/<what> until it answers code or 10 s pass.
func (a *appAgent) waitHealth(what string, code int) {
	a.t.Helper()
	waitFor(a.t, "/healthz/"+what+" to answer "+http.StatusText(code), func() bool { return a.health(what) == code })
}

// dial connects an SDS client to the agent's socket.
func (a *appAgent) dial() *sdsclient.Client {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, a.socket)
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { _ = c.Close() })
	return c
}

// stream opens an Envoy-like SDS stream for names on c.
func (a *appAgent) stream(c *sdsclient.Client, names ...string) *sdsclient.Stream {
	a.t.Helper()
	s, err := c.Stream(context.Background(), sdsclient.StreamConfig{Names: names})
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(s.Close)
	return s
}

// waitTimer waits until something waits on the fake clock.
func (a *appAgent) waitTimer() {
	a.t.Helper()
	waitFor(a.t, "a timer on the fake clock", a.clock.HasWaiters)
}

// step advances the fake clock by d once a timer waits on it.
func (a *appAgent) step(d time.Duration) {
	a.t.Helper()
	a.waitTimer()
	a.clock.Step(d)
}

// stepFiringNothing advances the fake clock by d and checks that no timer
// was due in that time: the fake clock fires due timers within Step, so a
// renewal due sooner than d shows as one waiter fewer when Step returns.
func (a *appAgent) stepFiringNothing(d time.Duration, what string) {
	a.t.Helper()
	a.waitTimer()
	before := a.clock.Waiters()
	a.clock.Step(d)
	if after := a.clock.Waiters(); after != before {
		a.t.Fatalf("%s: a timer fired within %s (%d waiters, then %d)", what, d, before, after)
	}
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testwait.Within(t, 10*time.Second, what, cond)
}

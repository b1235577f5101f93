package app

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/internal/settings"
)

// sourceConfig resolves a configuration whose paths all live under dir.
func sourceConfig(t *testing.T, dir string, env ...string) *settings.Config {
	t.Helper()
	env = append(env,
		"MESHAGENT_SDS_SOCKET="+filepath.Join(dir, "uds", "socket"),
		"MESHAGENT_WORKLOAD_CREDENTIALS_DIR="+filepath.Join(dir, "creds"),
		"MESHAGENT_FILE_MOUNTED_CERTS_DIR="+filepath.Join(dir, "certs"),
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1",
	)
	cfg, err := settings.Resolve(settings.Input{Env: env})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// serveGRPC serves an empty gRPC server on a Unix socket at path.
func serveGRPC(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
}

// staleSocket leaves a socket file that nobody listens on.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}

// silentSocket accepts connections and never speaks.
func silentSocket(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
}

func writeFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSelectSource(t *testing.T) {
	all := credentialFiles
	tests := []struct {
		name       string
		setup      func(t *testing.T, dir string)
		env        []string
		source     Source
		stale      bool
		reasonHas  string
		socketKept bool
	}{
		{name: "ca by default", source: SourceCA, reasonHas: "CA_PROVIDER=Citadel at CA_ADDR=istiod.istio-system.svc:15012"},
		{name: "ca linkerd", env: []string{"CA_PROVIDER=Linkerd", "CA_ADDR=127.0.0.1:8080"}, source: SourceCA, reasonHas: "CA_PROVIDER=Linkerd at CA_ADDR=127.0.0.1:8080"},
		{name: "healthy external socket", setup: func(t *testing.T, d string) { serveGRPC(t, filepath.Join(d, "uds", "socket")) }, source: SourceExternal, reasonHas: "already answers", socketKept: true},
		{name: "node mode replaces what answers", setup: func(t *testing.T, d string) { serveGRPC(t, filepath.Join(d, "uds", "socket")) }, env: []string{"MESHAGENT_MODE=node", "NODE_NAME=n1"}, source: SourceCA, reasonHas: "node mode replaces it", socketKept: true},
		{name: "a socket holder's socket is taken", setup: func(t *testing.T, d string) { serveGRPC(t, filepath.Join(d, "uds", "socket")) }, env: []string{"MESHAGENT_SOCKET_HANDOFF=" + "holder.sock"}, source: SourceCA, reasonHas: "takes it from its holder", socketKept: true},
		{name: "a stale socket is left to its holder", setup: func(t *testing.T, d string) { staleSocket(t, filepath.Join(d, "uds", "socket")) }, env: []string{"MESHAGENT_SOCKET_HANDOFF=" + "holder.sock"}, source: SourceCA, reasonHas: "left to its holder", socketKept: true},
		{name: "external wins over dev", setup: func(t *testing.T, d string) { serveGRPC(t, filepath.Join(d, "uds", "socket")) }, env: []string{"MESHAGENT_DEV=true"}, source: SourceExternal, socketKept: true},
		{name: "stale socket", setup: func(t *testing.T, d string) { staleSocket(t, filepath.Join(d, "uds", "socket")) }, source: SourceCA, stale: true, reasonHas: "will be removed", socketKept: true},
		{name: "silent socket", setup: func(t *testing.T, d string) { silentSocket(t, filepath.Join(d, "uds", "socket")) }, env: []string{"MESHAGENT_DEV=1"}, source: SourceDev, stale: true, reasonHas: "no answer within 1s: no gRPC answer", socketKept: true},
		{name: "not a socket", setup: func(t *testing.T, d string) { writeFiles(t, filepath.Join(d, "uds"), "socket") }, source: SourceCA, reasonHas: "not a socket: ", socketKept: true},
		{name: "dev", env: []string{"MESHAGENT_DEV=true"}, source: SourceDev, reasonHas: "not for production"},
		{name: "dev wins over credentials", setup: func(t *testing.T, d string) { writeFiles(t, filepath.Join(d, "creds"), all...) }, env: []string{"MESHAGENT_DEV=true"}, source: SourceDev},
		{name: "workload credentials", setup: func(t *testing.T, d string) { writeFiles(t, filepath.Join(d, "creds"), all...) }, env: []string{"FILE_MOUNTED_CERTS=true"}, source: SourceWorkloadCredentials, reasonHas: "cert-chain.pem, key.pem, root-cert.pem"},
		{name: "incomplete credentials", setup: func(t *testing.T, d string) { writeFiles(t, filepath.Join(d, "creds"), "cert-chain.pem", "key.pem") }, source: SourceCA, reasonHas: "incomplete (missing root-cert.pem)"},
		{name: "file mounted", env: []string{"FILE_MOUNTED_CERTS=true"}, source: SourceFileMounted, reasonHas: "FILE_MOUNTED_CERTS=true"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.setup != nil {
				tt.setup(t, dir)
			}
			cfg := sourceConfig(t, dir, tt.env...)
			// A silent socket is given up on after the probe's timeout: the
			// reason says so.
			d := SelectSource(context.Background(), cfg)
			if d.Source != tt.source || d.StaleSocket != tt.stale {
				t.Errorf("got %+v, want source %s stale %v", d, tt.source, tt.stale)
			}
			if !strings.Contains(d.Reason, tt.reasonHas) {
				t.Errorf("reason %q lacks %q", d.Reason, tt.reasonHas)
			}
			_, err := os.Lstat(cfg.SDSSocket)
			if exists := err == nil; exists != tt.socketKept {
				t.Errorf("socket exists=%v after SelectSource, want %v (SelectSource must not touch it)", exists, tt.socketKept)
			}
		})
	}
}

func TestRunRemovesStaleSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "uds", "socket")
	staleSocket(t, sock)
	// The status server, which reports readiness, starts only once the
	// agent's own socket listens at the path: whatever the goroutines'
	// order, a ready agent has its socket there. (A connection is what
	// tells the new socket from the stale one: a file system may give the
	// new one the old one's inode.)
	var atListen error
	cfg := Config{OnStatusListen: func(net.Addr) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			atListen = err
			return
		}
		c.Close()
	}}
	r := startApp(t, cfg, sourceConfig(t, dir, "MESHAGENT_DEV=true"))
	if atListen != nil {
		t.Errorf("the status server listened before the SDS socket was bound: %v", atListen)
	}
	r.waitReady(t)
	if st, err := os.Lstat(sock); err != nil || st.Mode().Type() != os.ModeSocket {
		t.Errorf("the agent does not serve SDS where the stale socket was: %v", err)
	}
	if r.logs.FilterMessage("removed stale SDS socket").Len() != 1 {
		t.Errorf("no log line for the removal: %v", r.logs.All())
	}
}

func TestRunLeavesExternalSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "uds", "socket")
	serveGRPC(t, sock)
	r := startApp(t, Config{}, sourceConfig(t, dir, "MESHAGENT_XDS_PROXY=false"))
	if r.app.Source().Source != SourceExternal {
		t.Fatalf("source %+v, want external", r.app.Source())
	}
	r.waitReady(t)
	r.stop(t)
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("external socket touched: %v", err)
	}
}

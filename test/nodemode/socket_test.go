package nodemode

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
)

// fromAgent reports whether what answered on the socket is the agent: the
// test process is a node process without an identity, which only the agent
// refuses with that reason.
func fromAgent(answer string) bool {
	return strings.Contains(answer, "PermissionDenied") && strings.Contains(answer, "not in a pod")
}

// bindImpostor binds a gRPC server (with no service) at path, as a pod that
// replaced the agent's socket would, until the test ends: it answers like an
// SDS server would to a probe, and refuses every call. It binds under
// another name and renames its socket onto path (the agent takes a removed
// path back at once, before a bind on it could follow the removal).
func bindImpostor(t *testing.T, path string) {
	t.Helper()
	tmp := path + ".impostor"
	lis, err := net.Listen("unix", tmp)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Rename(tmp, path); err != nil {
		_ = lis.Close()
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served })
}

// A pod that can write the socket directory replaces the agent's socket
// with its own: the agent binds the path again as soon as it sees it
// (logged and counted) and clients reach the agent, not the impostor.
func TestNodeSocketTakenBack(t *testing.T) {
	n := startNode(t, uniq("node"))
	sock := n.agent.Socket()
	if got := fetchOnce(sock, 10*time.Second, []string{"default"}); !fromAgent(got) {
		t.Fatalf("before: %s", got)
	}
	// The impostor's socket may be answered for a moment or not at all:
	// the agent takes the path back on the rename's inotify event.
	bindImpostor(t, sock)
	testwait.Within(t, 15*time.Second, "the agent binds its socket again", func() bool {
		return fromAgent(fetchOnce(sock, 2*time.Second, []string{"default"}))
	})
	if v := n.metric(`meshagent_socket_rebound_total{reason="replaced"}`); v < 1 {
		t.Errorf("rebinds counted: %v", v)
	}
	if !strings.Contains(n.agent.Logs(), "socket bound again") {
		t.Error("the rebind was not logged")
	}

	// Removed without a replacement: bound again too.
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, 15*time.Second, "the agent binds its removed socket again", func() bool {
		return fromAgent(fetchOnce(sock, 2*time.Second, []string{"default"}))
	})
	if v := n.metric(`meshagent_socket_rebound_total{reason="removed"}`); v < 1 {
		t.Errorf("rebinds after removal counted: %v", v)
	}
}

// What sits at the socket path when the node agent starts, an impostor's
// live socket or a regular file, is replaced: the agent starts and serves.
func TestNodeSocketPathTakenAtStart(t *testing.T) {
	for name, prepare := range map[string]func(t *testing.T, sock string){
		"impostor socket": bindImpostor,
		"regular file": func(t *testing.T, sock string) {
			if err := os.WriteFile(sock, []byte("not a socket"), 0o644); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			n := startNodeIn(t, uniq("node"), func(dir string) {
				sock := filepath.Join(dir, agentproc.SDSSocket)
				if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
					t.Fatal(err)
				}
				prepare(t, sock)
			})
			if got := fetchOnce(n.agent.Socket(), 10*time.Second, []string{"default"}); !fromAgent(got) {
				t.Fatalf("after start over a %s: %s", name, got)
			}
		})
	}
}

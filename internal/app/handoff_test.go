package app

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/uds/handoff"
)

// TestAgentAnswersWhatItsHolderKept: an SDS request made while no agent
// runs, on the socket a holder keeps (docs/node-mode.md, "Restarts"), is
// answered by the agent that then starts and takes the socket, through the
// agent's own socket server, on the connection the client made to the
// holder: the client dials once.
func TestAgentAnswersWhatItsHolderKept(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "uds", "socket")
	private := filepath.Join(dir, "holder.sock")
	ctx, cancel := context.WithCancel(context.Background())
	held := make(chan error, 1)
	h := &handoff.Holder{Path: sock, Private: private}
	go func() { held <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-held; err != nil {
			t.Errorf("holder: %v", err)
		}
	}()
	testwait.For(t, "the holder's socket", func() bool { _, err := os.Stat(sock); return err == nil })

	var dials atomic.Int32
	cc, err := grpc.NewClient("passthrough:///sds", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cc.Connect()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	for st := cc.GetState(); st != connectivity.Ready; st = cc.GetState() {
		if !cc.WaitForStateChange(wctx, st) {
			t.Fatal("no HTTP/2 handshake on the holder's socket")
		}
	}
	type answer struct {
		resp *discoveryv3.DiscoveryResponse
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := secretv3.NewSecretDiscoveryServiceClient(cc).FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{ResourceNames: []string{"default"}})
		answered <- answer{resp, err}
	}()
	testwait.For(t, "the holder keeping the request's connection", func() bool { return h.Parked() == 1 })

	r := startApp(t, Config{}, sourceConfig(t, dir, "MESHAGENT_DEV=true", "MESHAGENT_SOCKET_HANDOFF="+private))
	a := <-answered
	if a.err != nil {
		t.Fatalf("the request kept by the holder: %v, want the agent's answer", a.err)
	}
	if len(a.resp.GetResources()) != 1 {
		t.Fatalf("the agent answered %d resources, want the default certificate", len(a.resp.GetResources()))
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("the client dialled %d times, want once: the agent answers on the connection the holder kept", n)
	}
	r.stop(t)
}

package test

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	gsworkloadapi "github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/sdsclient"
	"github.com/meshagent/meshagent/test/xdsserver"
)

// drainAgent starts a dev sidecar whose PROXY_CONFIG terminationDrainDuration
// is drain, waits until it is ready and returns it with its status server's
// base URL.
func drainAgent(t *testing.T, drain string) (*agentproc.Proc, string) {
	t.Helper()
	p := agentproc.Start(t, agentproc.TempDir(t), "MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1",
		`PROXY_CONFIG={"terminationDrainDuration":"`+drain+`"}`)
	base := statusBase(t, p)
	waitFor(t, "ready", func() bool { code, _ := getStatus(t, base+"/healthz/ready"); return code == 200 })
	return p, base
}

// untilDeadline is a context ending shortly before the test's deadline:
// what the drain tests wait with, rather than a guess at machine speed.
func untilDeadline(t *testing.T) context.Context {
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Minute)
	}
	ctx, cancel := context.WithDeadline(t.Context(), deadline.Add(-10*time.Second))
	t.Cleanup(cancel)
	return ctx
}

// waitExit waits for p to exit, bounded by ctx, and returns its exit code.
func waitExit(t *testing.T, ctx context.Context, p *agentproc.Proc, after string) int {
	t.Helper()
	select {
	case <-p.Done():
		return p.ExitCode()
	case <-ctx.Done():
		t.Fatalf("the agent still runs at the test's deadline, %s", after)
		return -1
	}
}

// TestSIGTERMDrains: after SIGTERM a sidecar keeps serving through its
// drain, ten minutes here: an SDS stream opened before it is answered
// (a name added), a new SDS connection and a new Workload API connection
// are served; readiness answers 503 naming the drain while liveness stays
// 200; a second SIGTERM ends the process, with 0.
func TestSIGTERMDrains(t *testing.T) {
	p, base := drainAgent(t, "600s")
	ctx := untilDeadline(t)
	c, err := sdsclient.Dial(ctx, p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Stream(ctx, sdsclient.StreamConfig{Names: []string{secretmanager.WorkloadCertName}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first, err := s.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}

	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the drain's start in the log", func() bool { return strings.Contains(p.Logs(), "drain started") })
	if !strings.Contains(p.Logs(), `"drain":600`) {
		t.Errorf("the drain's length is not logged:\n%s", p.Logs())
	}

	if code, body := getStatus(t, base+"/healthz/ready"); code != http.StatusServiceUnavailable || !strings.Contains(body, "draining") {
		t.Errorf("ready while draining: %d %q, want 503 naming the drain", code, body)
	}
	if code, body := getStatus(t, base+"/healthz/live"); code != http.StatusOK {
		t.Errorf("live while draining: %d %q", code, body)
	}

	// The stream open before SIGTERM: a changed subscription is answered.
	if err := s.Request([]string{secretmanager.WorkloadCertName, secretmanager.RootCertName}, first.Nonce, first.Version); err != nil {
		t.Fatal(err)
	}
	r, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("the stream open before SIGTERM: %v", err)
	}
	if _, ok := r.TrustedCA(secretmanager.RootCertName); !ok {
		t.Errorf("the stream open before SIGTERM was answered with %v, want %s", r.Names, secretmanager.RootCertName)
	}

	// A connection made during the drain, over SDS and the Workload API.
	c2, err := sdsclient.Dial(ctx, p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if r, err := c2.Fetch(ctx, secretmanager.WorkloadCertName); err != nil {
		t.Errorf("SDS connection made during the drain: %v", err)
	} else if _, _, ok := r.Cert(secretmanager.WorkloadCertName); !ok {
		t.Errorf("SDS connection made during the drain got %v", r.Names)
	}
	if svid, err := gsworkloadapi.FetchX509SVID(ctx, gsworkloadapi.WithAddr("unix://"+p.Socket())); err != nil {
		t.Errorf("Workload API connection made during the drain: %v", err)
	} else if svid.ID.String() != "spiffe://cluster.local/ns/default/sa/default" {
		t.Errorf("Workload API during the drain: %s", svid.ID)
	}
	if code := p.ExitCode(); code != -1 {
		t.Fatalf("the agent exited (%d) during its drain", code)
	}

	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, ctx, p, "after a second SIGTERM during the drain"); code != 0 {
		t.Errorf("exit %d after a second SIGTERM, want 0", code)
	}
	if !strings.Contains(p.Logs(), "drain cut short by a second signal") {
		t.Errorf("the cut is not logged:\n%s", p.Logs())
	}
}

// TestDrainEndsWithExitZero: a drain that runs out stops the agent by
// itself, with 0; its end is logged.
func TestDrainEndsWithExitZero(t *testing.T) {
	p, _ := drainAgent(t, "2s")
	ctx := untilDeadline(t)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, ctx, p, "after its 2s drain"); code != 0 {
		t.Errorf("exit %d after the drain, want 0", code)
	}
	logs := p.Logs()
	start, end, stopped := strings.Index(logs, "drain started"), strings.Index(logs, "drain ended"), strings.Index(logs, `"agent stopped"`)
	if start < 0 || end < start || stopped < end || strings.Contains(logs, "cut short") {
		t.Errorf("want drain started, drain ended, agent stopped in that order:\n%s", logs)
	}
}

// TestZeroDrainStopsAtOnce: terminationDrainDuration 0s: SIGTERM stops
// the agent with 0 and no drain.
func TestZeroDrainStopsAtOnce(t *testing.T) {
	p, _ := drainAgent(t, "0s")
	ctx := untilDeadline(t)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, ctx, p, "after SIGTERM with no drain"); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	if logs := p.Logs(); strings.Contains(logs, "drain started") || !strings.Contains(logs, "stopping without a drain") {
		t.Errorf("logs:\n%s", logs)
	}
}

// TestQuitEndsTheDrain: /quitquitquit keeps its meaning during a drain:
// the agent stops at once, with 0.
func TestQuitEndsTheDrain(t *testing.T) {
	p, base := drainAgent(t, "600s")
	ctx := untilDeadline(t)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the drain's start in the log", func() bool { return strings.Contains(p.Logs(), "drain started") })
	resp, err := http.Post(base+"/quitquitquit", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code := waitExit(t, ctx, p, "after /quitquitquit during the drain"); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}

// TestSIGTERMDrainsTheXDSProxy: during the drain the xDS proxy keeps an ADS
// stream opened before SIGTERM and forwards one opened after it, each
// answered by the control plane.
func TestSIGTERMDrainsTheXDSProxy(t *testing.T) {
	ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{vmToken: vmSA}})
	xs := xdsserver.Start(t, xdsserver.Config{CA: ca.CA(), ServerNames: []string{istioca.DefaultServerName}, Tokens: []string{vmToken}})
	const node = "sidecar~127.0.0.1~vm-1.vm~vm.svc.cluster.local"
	publish := func(version string) {
		t.Helper()
		if err := xs.SetResources(node, version, map[resource.Type][]types.Resource{
			resource.ClusterType: {&clusterv3.Cluster{Name: "drain-" + version}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	publish("1")

	dir := agentproc.TempDir(t)
	vmWriteToken(t, dir)
	root := filepath.Join(dir, "root-cert.pem")
	flWrite(t, root, ca.RootPEM())
	proxyConfig, _ := json.Marshal(map[string]any{"discoveryAddress": xs.Addr(), "terminationDrainDuration": "600s"})
	p := agentproc.Start(t, dir, vmEnv(ca, dir, "MESHAGENT_XDS_PROXY=true", "PROXY_CONFIG="+string(proxyConfig),
		"CA_ROOT_CA="+root, "XDS_ROOT_CA="+root, "STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1")...)
	ctx := untilDeadline(t)

	// ads opens a stream on a connection of its own and returns it with
	// its first response.
	ads := func(what string) (discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, *discoveryv3.DiscoveryResponse) {
		t.Helper()
		conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "etc/istio/proxy/XDS"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx, grpc.WaitForReady(true))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: resource.ClusterType}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, p.Logs())
		}
		return stream, r
	}
	before, first := ads("the stream opened before SIGTERM")

	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the drain's start in the log", func() bool { return strings.Contains(p.Logs(), "drain started") })

	if _, r := ads("a stream opened during the drain"); r.GetVersionInfo() != "1" {
		t.Errorf("a stream opened during the drain got version %q, want 1", r.GetVersionInfo())
	}
	// The stream opened before: ACKed, then a new version is pushed to it.
	if err := before.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: resource.ClusterType,
		VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	publish("2")
	r, err := before.Recv()
	if err != nil || r.GetVersionInfo() != "2" {
		t.Errorf("the stream opened before SIGTERM, during the drain: %v, version %q, want 2", err, r.GetVersionInfo())
	}
	if code := p.ExitCode(); code != -1 {
		t.Fatalf("the agent exited (%d) during its drain", code)
	}
	if err := p.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, ctx, p, "after SIGINT during the drain"); code != 0 {
		t.Errorf("exit %d after SIGINT during the drain, want 0", code)
	}
}

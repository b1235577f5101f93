package test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/xdsserver"
)

// vmJWT is a JWT-shaped onboarding token expiring at exp (unsigned: the
// test's CA and control plane accept it by its text, the agent reads only
// its expiry).
func vmJWT(exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	claims, _ := json.Marshal(map[string]any{"sub": "system:serviceaccount:vm:app", "exp": exp.Unix()})
	return enc([]byte(`{"alg":"RS256","typ":"JWT"}`)) + "." + enc(claims) + ".c2ln"
}

// VM flow after the onboarding token expires: PROV_CERT is the OUTPUT_CERTS
// directory; the first certificate comes with the token, then the token file
// holds an expired token (which neither the CA nor the control plane
// accepts). The control plane restarts: the xDS proxy's new upstream stream
// is authenticated by the workload certificate, and the certificate keeps
// being renewed by it; the expired token is never sent.
func TestVMAfterTokenExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the built agent")
	}
	valid, expired := vmJWT(time.Now().Add(time.Hour)), vmJWT(time.Now().Add(-time.Hour))
	ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{valid: vmSA}})
	xs := xdsserver.Start(t, xdsserver.Config{CA: ca.CA(), ServerNames: []string{istioca.DefaultServerName},
		Tokens: []string{valid}, ClientCAs: ca.CA().Pool()})

	dir := agentproc.TempDir(t)
	out := filepath.Join(dir, "certs")
	root := filepath.Join(dir, "root-cert.pem")
	flWrite(t, root, ca.RootPEM())
	vmWriteTokenText(t, dir, valid)
	proxyConfig, _ := json.Marshal(map[string]any{"discoveryAddress": xs.Addr()})
	p := agentproc.Start(t, dir, vmEnv(ca, dir,
		"MESHAGENT_XDS_PROXY=true", "PROXY_CONFIG="+string(proxyConfig),
		"CA_ROOT_CA="+root, "XDS_ROOT_CA="+root,
		"PROV_CERT="+out, "OUTPUT_CERTS="+out, "SECRET_TTL=4s")...)
	chainPath := filepath.Join(out, files.CertChainFile)
	testwait.Within(t, 30*time.Second, "the first certificate in OUTPUT_CERTS", func() bool {
		_, err := os.Stat(chainPath)
		return err == nil
	})

	// An xDS client on the proxy's socket: one stream, held.
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "etc/istio/proxy/XDS"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "sidecar~127.0.0.1~vm-1.vm~vm.svc.cluster.local"},
		TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"}); err != nil {
		t.Fatal(err)
	}
	if !xs.WaitStreams(30*time.Second, func(c xdsserver.Counts) bool { return c.Active >= 1 }) {
		t.Fatalf("no upstream stream with the valid token: %+v\n%s", xs.Streams(), p.Logs())
	}

	// The token expires (its file now holds an expired one); the control
	// plane restarts, so the proxy connects and authenticates anew.
	flRename(t, filepath.Join(dir, "istio-token"), []byte(expired))
	before, _ := os.ReadFile(chainPath)
	xs.Restart(t)
	if !xs.WaitStreams(30*time.Second, func(c xdsserver.Counts) bool { return c.Active >= 1 }) {
		t.Fatalf("no upstream stream after the restart with an expired token: %+v\n%s", xs.Streams(), p.Logs())
	}
	if n := xs.Streams().Rejected; n != 0 {
		t.Errorf("the control plane refused %d streams", n)
	}
	last := xs.LastMetadata()
	if got := last.Get("authorization"); len(got) != 0 {
		t.Errorf("the new upstream stream carried %q, want no token (the certificate authenticates it)", got)
	}
	// Renewals go on with the certificate.
	requests := ca.Requests()
	testwait.Within(t, 30*time.Second, "two renewals after the token expired", func() bool {
		now, _ := os.ReadFile(chainPath)
		return ca.Requests() >= requests+2 && string(now) != string(before)
	})
	for _, tok := range ca.Tokens() {
		if tok == "Bearer "+expired {
			t.Errorf("the expired token was sent to the CA")
		}
	}
	if !strings.Contains(p.Logs(), "bearer token expired") {
		t.Errorf("no log line for the expired token:\n%s", p.Logs())
	}
}

func vmWriteTokenText(t *testing.T, dir, tok string) {
	t.Helper()
	flWrite(t, filepath.Join(dir, "istio-token"), []byte(tok))
}

package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFetchADSFromControlPlane(t *testing.T) {
	fx, err := startFixture()
	if err != nil {
		t.Fatal(err)
	}
	defer fx.Close()
	const total = 3<<20 + 5
	if err := fx.publishBig("1", total, 1<<20); err != nil {
		t.Fatal(err)
	}
	conn, err := fx.dialControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := waitReady(ctx, conn); err != nil {
		t.Fatal(err)
	}
	size, d, err := fetchADS(ctx, conn, bigRequest())
	if err != nil {
		t.Fatal(err)
	}
	// Four secrets of payload plus their names, type URLs and framing.
	if size < total || size > total+4096 {
		t.Errorf("response of %d bytes for %d bytes of payload", size, total)
	}
	if d <= 0 {
		t.Errorf("elapsed %v", d)
	}
	calls := fx.xds.Calls()
	if len(calls) != 1 || len(calls[0].Requests) == 0 || calls[0].Requests[0].GetNode().GetId() != bigNode {
		t.Fatalf("control plane saw %+v", calls)
	}
	if got := calls[0].Metadata.Get("authorization"); !slices.Equal(got, []string{"Bearer " + benchToken}) {
		t.Errorf("authorization %q", got)
	}

	// A node with nothing published gets no answer before the deadline.
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	req := bigRequest()
	req.Node.Id = "nobody"
	if _, _, err := fetchADS(short, conn, req); err == nil {
		t.Error("an answer for a node with no snapshot")
	}
}

func TestAgentConfigFromFixture(t *testing.T) {
	fx, err := startFixture()
	if err != nil {
		t.Fatal(err)
	}
	defer fx.Close()
	cfg := fx.agentConfig("/bin/true", []string{"run"}, "rsa-2048", 10*time.Second)
	dir := t.TempDir()
	if err := prepareAgentDir(dir, cfg); err != nil {
		t.Fatal(err)
	}
	tok, err := os.ReadFile(filepath.Join(dir, tokenPath))
	if err != nil || string(tok) != benchToken {
		t.Errorf("token file %q, %v", tok, err)
	}
	root, err := os.ReadFile(filepath.Join(dir, caRootPath))
	if err != nil || string(root) != string(fx.ca.RootPEM()) {
		t.Errorf("root file differs from the CA root (%v)", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, tokenPath)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, %v", fi.Mode(), err)
	}
	env := agentEnv(dir, cfg)
	want := []string{
		"CA_ADDR=" + fx.ca.Addr(),
		"ISTIOD_SAN=istiod.istio-system.svc",
		"TRUST_DOMAIN=cluster.local",
		"POD_NAMESPACE=bench",
		"SERVICE_ACCOUNT=meshbench",
		`PROXY_CONFIG={"discoveryAddress":"` + fx.xds.Addr() + `","terminationDrainDuration":"0s"}`,
		"XDS_ROOT_CA=" + filepath.Join(dir, caRootPath),
		"STATUS_PORT=0",
		"MESHAGENT_STATUS_HOST=127.0.0.1",
		"MESHAGENT_KEY_TYPE=rsa-2048",
		"SECRET_TTL=10s",
	}
	for _, w := range want {
		if !slices.Contains(env, w) {
			t.Errorf("environment lacks %s: %q", w, env)
		}
	}
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		if strings.HasPrefix(k, "GO") || k == "KUBERNETES_SERVICE_HOST" {
			t.Errorf("inherited %s", e)
		}
	}
	for _, addr := range []string{fx.ca.Addr(), fx.xds.Addr()} {
		if !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Errorf("server on %s, not loopback", addr)
		}
	}
}

package csi

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func dial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// The kubelet's side of registration: GetInfo on the registration socket, the CSI
// calls on the endpoint it names, then the verdict.
func TestServerRegistersWithTheKubelet(t *testing.T) {
	dir := t.TempDir()
	d, err := NewDriver(DriverConfig{NodeID: "node-1", SocketDir: dir, TargetRoot: filepath.Join(dir, "pods"), Version: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{
		Driver:             d,
		Endpoint:           filepath.Join(dir, "plugins", DriverName, "csi.sock"),
		RegistrationSocket: filepath.Join(dir, "plugins_registry", DriverName+"-reg.sock"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	reg := registerapi.NewRegistrationClient(dial(t, srv.cfg.RegistrationSocket))
	var info *registerapi.PluginInfo
	for {
		info, err = reg.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != DriverName || info.Endpoint != srv.cfg.Endpoint || len(info.SupportedVersions) == 0 {
		t.Fatalf("GetInfo = %+v", info)
	}
	conn := dial(t, info.Endpoint)
	pi, err := csipb.NewIdentityClient(conn).GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
	if err != nil || pi.Name != DriverName || pi.VendorVersion != "v1" {
		t.Fatalf("GetPluginInfo = %v, %v", pi, err)
	}
	ni, err := csipb.NewNodeClient(conn).NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	if err != nil || ni.NodeId != "node-1" {
		t.Fatalf("NodeGetInfo = %v, %v", ni, err)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	// A refusal stops the server with the kubelet's reason.
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{Error: "version 9 unsupported"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "version 9 unsupported") {
			t.Fatalf("Run = %v, want the kubelet's refusal", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not stop after the kubelet refused the driver")
	}
}

func TestServerStopsWithItsContext(t *testing.T) {
	dir := t.TempDir()
	d, err := NewDriver(DriverConfig{NodeID: "n", SocketDir: dir, TargetRoot: filepath.Join(dir, "pods")})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{Driver: d, Endpoint: filepath.Join(dir, "csi.sock"), RegistrationSocket: filepath.Join(dir, "reg.sock")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	if _, err := csipb.NewIdentityClient(dial(t, srv.cfg.Endpoint)).Probe(context.Background(), &csipb.ProbeRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel = %v", err)
	}
}

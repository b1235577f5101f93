package grpcbootstrap

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestGenerateGolden(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{
			name: "proxyless",
			cfg: Config{
				XDSSocket: "./etc/istio/proxy/XDS",
				WorkDir:   "/srv/app",
				NodeID:    SidecarNodeID("10.1.2.3", "echo-6d4f", "apps", ""),
				NodeMetadata: map[string]any{
					"CLUSTER_ID":    "Kubernetes",
					"NAMESPACE":     "apps",
					"INSTANCE_IPS":  "10.1.2.3",
					"ISTIO_VERSION": "1.28.0",
				},
				Locality:  &Locality{Region: "eu-west1", Zone: "eu-west1-b"},
				CertDir:   "var/lib/meshagent/certs",
				SecretTTL: 24 * time.Hour,
			},
		},
		{
			name: "short-ttl",
			cfg: Config{
				XDSSocket:    "/var/run/meshagent/XDS",
				WorkDir:      "/",
				NodeID:       SidecarNodeID("192.168.0.7", "vm-1", "billing", "corp.internal"),
				NodeMetadata: map[string]any{"GENERATOR": "grpc", "LABELS": map[string]string{"app": "billing"}},
				CertDir:      "/etc/meshagent/certs",
				SecretTTL:    5 * time.Minute,
			},
		},
		{
			name: "plaintext",
			cfg: Config{
				XDSSocket: "XDS",
				WorkDir:   "/home/dev/project",
				NodeID:    "sidecar~127.0.0.1~dev.default~default.svc.cluster.local",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Generate(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", tt.name+".golden.json")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("bootstrap differs from %s (run with -update if intended):\n%s", golden, got)
			}
		})
	}
}

func TestServerURIIsAbsolute(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		socket, workDir, want string
	}{
		{"./etc/istio/proxy/XDS", "/srv/app", "unix:///srv/app/etc/istio/proxy/XDS"},
		{"etc/istio/proxy/XDS", "/", "unix:///etc/istio/proxy/XDS"},
		{"/run/meshagent/XDS", "/srv/app", "unix:///run/meshagent/XDS"},
		{"../shared/XDS", "/srv/app", "unix:///srv/shared/XDS"},
		{"etc/istio/proxy/XDS", "", "unix://" + filepath.Join(wd, "etc/istio/proxy/XDS")},
	}
	for _, tt := range tests {
		t.Run(tt.socket+" in "+tt.workDir, func(t *testing.T) {
			got := decode(t, Config{XDSSocket: tt.socket, WorkDir: tt.workDir, NodeID: "n"})
			if uri := got.XDSServers[0].ServerURI; uri != tt.want {
				t.Fatalf("server_uri %s, want %s", uri, tt.want)
			}
		})
	}
}

func decode(t *testing.T, cfg Config) bootstrap {
	t.Helper()
	data, err := Generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrap
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRefreshInterval(t *testing.T) {
	tests := []struct {
		ttl, want time.Duration
	}{
		{0, 900 * time.Second}, // SECRET_TTL default 24h
		{24 * time.Hour, 900 * time.Second},
		{150 * time.Minute, 900 * time.Second},
		{time.Hour, 360 * time.Second},
		{5 * time.Minute, 30 * time.Second},
		{time.Minute, 6 * time.Second},
		{15 * time.Second, time.Second},
		{time.Second, time.Second},
	}
	for _, tt := range tests {
		if got := RefreshInterval(tt.ttl); got != tt.want {
			t.Errorf("RefreshInterval(%s) = %s, want %s", tt.ttl, got, tt.want)
		}
	}
	got := decode(t, Config{XDSSocket: "/x", NodeID: "n", CertDir: "/c", SecretTTL: time.Hour})
	if ri := got.CertificateProviders[CertProviderInstance].Config.RefreshInterval; ri != "360s" {
		t.Fatalf("refresh_interval %q, want 360s", ri)
	}
}

func TestGeneratorDefault(t *testing.T) {
	got := decode(t, Config{XDSSocket: "/x", NodeID: "n", NodeMetadata: map[string]any{"CLUSTER_ID": "c1"}})
	if got.Node.Metadata["GENERATOR"] != DefaultGenerator || got.Node.Metadata["CLUSTER_ID"] != "c1" {
		t.Fatalf("metadata %v", got.Node.Metadata)
	}
	got = decode(t, Config{XDSSocket: "/x", NodeID: "n", NodeMetadata: map[string]any{"GENERATOR": "custom"}})
	if got.Node.Metadata["GENERATOR"] != "custom" {
		t.Fatalf("GENERATOR overridden: %v", got.Node.Metadata)
	}
}

func TestSidecarNodeID(t *testing.T) {
	if got, want := SidecarNodeID("10.0.0.1", "p", "ns", ""), "sidecar~10.0.0.1~p.ns~ns.svc.cluster.local"; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
}

func TestGenerateErrors(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no socket":          {NodeID: "n"},
		"no node id":         {XDSSocket: "/x"},
		"relative work dir":  {XDSSocket: "x", NodeID: "n", WorkDir: "rel"},
		"percent in socket":  {XDSSocket: "/run/x%2f/XDS", NodeID: "n"},
		"unencodable values": {XDSSocket: "/x", NodeID: "n", NodeMetadata: map[string]any{"f": func() {}}},
	} {
		if _, err := Generate(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestWriteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "etc", "istio", "proxy", "grpc-bootstrap.json")
	cfg := Config{XDSSocket: "/run/XDS", NodeID: "n", CertDir: "/certs"}
	written, err := WriteFile(path, cfg)
	if err != nil || !written {
		t.Fatalf("first write: %v, %v", written, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %#o", fi.Mode().Perm())
	}
	if written, err := WriteFile(path, cfg); err != nil || written {
		t.Fatalf("unchanged bootstrap rewritten: %v, %v", written, err)
	}
	cfg.SecretTTL = time.Hour
	if written, err := WriteFile(path, cfg); err != nil || !written {
		t.Fatalf("changed bootstrap not written: %v, %v", written, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}

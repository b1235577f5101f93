package grpcbootstrap

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials/tls/certprovider"
	"google.golang.org/grpc/credentials/tls/certprovider/pemfile"
	"google.golang.org/grpc/xds"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/files/outputcerts"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

var testID = pki.SPIFFEIdentity("cluster.local", "apps", "echo")

// writeOutputCerts issues a certificate and writes it with the roots into
// dir as the agent does; it returns the leaf.
func writeOutputCerts(t *testing.T, ca *localca.CA, dir string, ttl time.Duration) *x509.Certificate {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.Issue(localca.Leaf{PublicKey: key.Public(), Identity: testID, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	w, err := outputcerts.New(outputcerts.Config{Dir: dir, KeyMode: 0o600, CertMode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(outputcerts.Files{CertChain: pki.EncodeCertificates(chain[:len(chain)-1]), Key: keyPEM, Root: ca.RootPEM()}); err != nil {
		t.Fatal(err)
	}
	return chain[0]
}

// providerConfig returns certificate_providers.default.config from a
// generated bootstrap, as gRPC's bootstrap parser hands it to the plugin.
func providerConfig(t *testing.T, data []byte) json.RawMessage {
	t.Helper()
	var raw struct {
		CertificateProviders map[string]struct {
			PluginName string          `json:"plugin_name"`
			Config     json.RawMessage `json:"config"`
		} `json:"certificate_providers"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	p, ok := raw.CertificateProviders[CertProviderInstance]
	if !ok || p.PluginName != pemfile.PluginName {
		t.Fatalf("no %s provider named %q in the bootstrap", pemfile.PluginName, CertProviderInstance)
	}
	return p.Config
}

// buildProvider builds gRPC's own file_watcher provider from the bootstrap.
func buildProvider(t *testing.T, data []byte) certprovider.Provider {
	t.Helper()
	bc, err := certprovider.ParseConfig(pemfile.PluginName, providerConfig(t, data))
	if err != nil {
		t.Fatalf("gRPC's file_watcher rejects the configuration: %v", err)
	}
	prov, err := bc.Build(certprovider.BuildOptions{CertName: CertProviderInstance, WantIdentity: true, WantRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.Close)
	return prov
}

func keyMaterial(t *testing.T, prov certprovider.Provider) *certprovider.KeyMaterial {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	km, err := prov.KeyMaterial(ctx)
	if err != nil {
		t.Fatalf("gRPC's file_watcher read no key material: %v", err)
	}
	return km
}

// grpc-go's xDS server parses the generated bootstraps (its bootstrap
// parser, the file_watcher plugin's config parser, and its own check that
// the listener template is present) and accepts them.
func TestAcceptedByGRPCXDSServer(t *testing.T) {
	if os.Getenv("GRPC_XDS_BOOTSTRAP") != "" || os.Getenv("GRPC_XDS_BOOTSTRAP_CONFIG") != "" {
		t.Skip("a process-wide xDS bootstrap is set; it would hide parse failures")
	}
	good, err := Generate(Config{
		XDSSocket: "./etc/istio/proxy/XDS", WorkDir: t.TempDir(), NodeID: SidecarNodeID("127.0.0.1", "p", "ns", ""),
		NodeMetadata: map[string]any{"CLUSTER_ID": "Kubernetes"}, Locality: &Locality{Zone: "z"},
		CertDir: "certs", SecretTTL: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Generate(Config{XDSSocket: "/run/XDS", WorkDir: "/", NodeID: "n"})
	if err != nil {
		t.Fatal(err)
	}
	// Controls: the same check must reject broken bootstraps, or passing it
	// proves nothing.
	noTemplate := bytes.Replace(good, []byte(`"server_listener_resource_name_template"`), []byte(`"unused"`), 1)
	badRefresh := bytes.Replace(good, []byte(`"refresh_interval": "6s"`), []byte(`"refresh_interval": "soon"`), 1)
	splitDirs := bytes.Replace(good, []byte(`/certs/key.pem`), []byte(`/elsewhere/key.pem`), 1)
	for _, b := range [][]byte{noTemplate, badRefresh, splitDirs} {
		if bytes.Equal(b, good) {
			t.Fatal("control bootstrap not modified; the golden shape changed")
		}
	}
	// When the given contents fail to parse, grpc-go logs the reason and
	// falls back to the environment, which names no bootstrap here.
	const parseFailed = "not defined"
	tests := []struct {
		name        string
		data        []byte
		wantErr     string // empty: accepted
		providerErr string // the file_watcher plugin's own complaint
	}{
		{"generated", good, "", ""},
		{"generated without certificates", plain, "", ""},
		{"no listener template", noTemplate, "server_listener_resource_name_template", ""},
		{"bad refresh interval", badRefresh, parseFailed, "soon"},
		{"key and certificate in different directories", splitDirs, parseFailed, "same directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := xds.NewGRPCServer(xds.BootstrapContentsForTesting(tt.data))
			if err == nil {
				s.Stop()
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatal("accepted")
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				// Rejected, but for another reason: the check did not
				// look at what the case changed.
				t.Fatalf("rejected with %q, want a complaint about %q", err, tt.wantErr)
			}
			if tt.providerErr != "" {
				_, err := certprovider.ParseConfig(pemfile.PluginName, providerConfig(t, tt.data))
				if err == nil || !strings.Contains(err.Error(), tt.providerErr) {
					t.Fatalf("file_watcher config error %v, want a complaint about %q", err, tt.providerErr)
				}
			}
		})
	}
}

// gRPC's file_watcher, configured from the generated bootstrap, reads the
// files outputcerts writes, and picks up a rotation within the refresh
// interval derived from the TTL.
func TestFileWatcherReadsOutputCerts(t *testing.T) {
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	certDir := filepath.Join(work, "var", "lib", "meshagent")
	const ttl = 10 * time.Second // refresh interval 1s
	leaf := writeOutputCerts(t, ca, certDir, ttl)
	data, err := Generate(Config{XDSSocket: "XDS", WorkDir: work, NodeID: "n", CertDir: "var/lib/meshagent", SecretTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	prov := buildProvider(t, data)
	km := keyMaterial(t, prov)
	if len(km.Certs) != 1 || !km.Certs[0].Leaf.Equal(leaf) {
		t.Fatal("gRPC loaded a different certificate")
	}
	if len(km.Certs[0].Certificate) != 2 {
		t.Fatalf("gRPC loaded a chain of %d certificates, want leaf and intermediate", len(km.Certs[0].Certificate))
	}
	inter, err := x509.ParseCertificate(km.Certs[0].Certificate[1])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: km.Roots, Intermediates: pki.CertPool([]*x509.Certificate{inter}), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("gRPC's roots do not verify the leaf: %v", err)
	}

	next := writeOutputCerts(t, ca, certDir, ttl)
	start := time.Now()
	deadline := start.Add(RefreshInterval(ttl) + 3*time.Second)
	for {
		if km := keyMaterial(t, prov); km.Certs[0].Leaf.Equal(next) {
			t.Logf("gRPC picked up the rotated certificate after %s", time.Since(start).Round(10*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("gRPC's file_watcher did not pick up the rotated certificate")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// With SPIFFEBundleMap, gRPC's own file_watcher reads the SPIFFE trust
// bundle map the agent writes beside the other files (gRFC A87) and hands
// out its roots per trust domain. gRPC reads the map only with
// GRPC_EXPERIMENTAL_XDS_MTLS_SPIFFE=true, looked at when it starts: the
// test runs again in a process of its own with it set.
func TestSPIFFEBundleMapReadByGRPC(t *testing.T) {
	const gate = "GRPC_EXPERIMENTAL_XDS_MTLS_SPIFFE"
	if os.Getenv(gate) != "true" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSPIFFEBundleMapReadByGRPC$", "-test.v")
		cmd.Env = append(os.Environ(), gate+"=true")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestSPIFFEBundleMapReadByGRPC")) {
			t.Fatalf("with %s=true: %v\n%s", gate, err, out)
		}
		return
	}
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeOutputCerts(t, ca, dir, time.Hour)
	bm, err := outputcerts.BundleMap("cluster.local", []*x509.Certificate{ca.Root()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := outputcerts.New(outputcerts.Config{Dir: dir, KeyMode: 0o600, CertMode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(outputcerts.Files{BundleMap: bm}); err != nil {
		t.Fatal(err)
	}
	data, err := Generate(Config{XDSSocket: "/x/XDS", NodeID: "n", CertDir: dir, SPIFFEBundleMap: true})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(`"spiffe_trust_bundle_map_file": "`+filepath.Join(dir, files.BundleMapFile)+`"`)) {
		t.Fatalf("no spiffe_trust_bundle_map_file in\n%s", data)
	}
	km := keyMaterial(t, buildProvider(t, data))
	b, ok := km.SPIFFEBundleMap["cluster.local"]
	if !ok {
		t.Fatalf("gRPC read no bundle for cluster.local: %v", km.SPIFFEBundleMap)
	}
	if got := b.X509Authorities(); len(got) != 1 || !got[0].Equal(ca.Root()) {
		t.Errorf("gRPC's roots for cluster.local: %v", got)
	}
}

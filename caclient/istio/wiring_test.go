package istio

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/istioca"
)

// The client wired as the agent wires it from its settings (CA_ADDR,
// ISTIOD_SAN, the CA root file, the token file, ISTIO_META_CLUSTER_ID)
// gets a certificate for its identity that verifies to the CA's root, and
// the CA sees the token and the cluster.
func TestNewWiredFromFiles(t *testing.T) {
	ca := startCA(t, istioca.Config{})
	dir := t.TempDir()
	rootPath := filepath.Join(dir, files.RootCertFile)
	if err := os.WriteFile(rootPath, ca.RootPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	tokenPath := filepath.Join(dir, "istio-token")
	writeToken(t, tokenPath, tokenA)

	rootPEM, err := os.ReadFile(rootPath)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := pki.ParseCertificates(rootPEM)
	if err != nil {
		t.Fatal(err)
	}
	client, err := New(Config{
		Transport: controlplane.Config{
			Addr:       ca.Addr(),
			ServerName: ca.ServerName(),
			Plaintext:  PlaintextPort(ca.Addr()),
			Roots:      controlplane.StaticRoots{Pool: pki.CertPool(roots)},
			Token:      credfetcher.File{Path: tokenPath},
			Metadata:   map[string]string{"ClusterID": "Kubernetes"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	id := pki.SPIFFEIdentity("cluster.local", appSA.Namespace, appSA.Name)
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	chain, err := client.Sign(ctx, csr, id, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.VerifyIssued(chain, key.Public(), id, pki.CertPool(roots), time.Now()); err != nil {
		t.Fatalf("issued chain rejected: %s", pki.Reason(err))
	}
	if got := ca.Tokens(); len(got) != 1 || got[0] != "Bearer "+tokenA {
		t.Errorf("the CA saw tokens %q, want the file's", got)
	}
	if got := ca.LastMetadata().Get("ClusterID"); len(got) != 1 || got[0] != "Kubernetes" {
		t.Errorf("the CA saw ClusterID %q", got)
	}
}

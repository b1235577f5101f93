package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/status"
	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/podproc"
)

// kube is the package's API server, started by the first test that needs it.
var kube = &kubeenv.Shared{}

func kubeEnv(t *testing.T) *kubeenv.Env {
	t.Helper()
	return kube.Env(t)
}

// fetchAsPod fetches "default" (or name) from the agent's socket as a
// process of pod uid, and returns the certificate's URI SAN or "error: ...".
func fetchAsPod(t *testing.T, sock, uid string, shape podproc.Shape, name ...string) string {
	t.Helper()
	n := "default"
	if len(name) > 0 {
		n = name[0]
	}
	cert, err := podproc.FetchAsPod(t, sock, uid, shape, n)
	if err != nil {
		return "error: " + err.Error()
	}
	if len(cert.URIs) != 1 {
		return fmt.Sprintf("error: bad certificate: %d URI SANs", len(cert.URIs))
	}
	return cert.URIs[0].String()
}

func TestNodeModeNeedsNodeName(t *testing.T) {
	t.Chdir(t.TempDir())
	code, _, stderr := runCmd(t, []string{"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1"}, "run", "--node", "--dev")
	if code != exitConfig || !strings.Contains(stderr, "NODE_NAME") {
		t.Fatalf("exit %d; log:\n%s", code, stderr)
	}
}

// TestNodeModeServesEachPodItsIdentity: one agent, one socket, the pods of
// the node from a real API server, callers in real pod cgroups: each pod
// gets the certificate of its own service account, a pod of another node
// gets nothing.
func TestNodeModeServesEachPodItsIdentity(t *testing.T) {
	kube := kubeEnv(t)
	dir := t.TempDir()
	t.Chdir(dir)
	ctx := context.Background()
	ns := fmt.Sprintf("node-e2e-%d", time.Now().UnixNano())
	if _, err := kube.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	uid := map[string]string{}
	for _, p := range []struct{ name, sa, node string }{
		{"cart-0", "cart", "node-e2e"}, {"pay-0", "payments", "node-e2e"}, {"far-0", "cart", "node-other"},
	} {
		if _, err := kube.CreateServiceAccount(ctx, ns, p.sa); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
		pod, err := kube.CreatePod(ctx, ns, p.name, p.sa, p.node)
		if err != nil {
			t.Fatal(err)
		}
		uid[p.name] = string(pod.UID)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := kube.Kubeconfig(kubeconfig, kube.AdminToken()); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	base, wait, log := startAgent(t, runCtx, []string{
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", "MESHAGENT_DEV=true",
		"MESHAGENT_MODE=node", "NODE_NAME=node-e2e", "KUBECONFIG=" + kubeconfig,
	})
	if code, body := waitReady(t, base); code != 200 {
		t.Fatalf("ready: %d %q; log:\n%s", code, body, log)
	}
	sock := filepath.Join(dir, "var/run/secrets/workload-spiffe-uds/socket")
	// Pods' processes of any uid must reach the socket.
	if fi, err := os.Stat(filepath.Dir(sock)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("node mode socket directory: %v, %v; want 0755", fi.Mode(), err)
	}

	if got, want := fetchAsPod(t, sock, uid["cart-0"], podproc.Cgroupfs), "spiffe://cluster.local/ns/"+ns+"/sa/cart"; got != want {
		t.Errorf("cart-0 got %q, want %q", got, want)
	}
	if got, want := fetchAsPod(t, sock, uid["pay-0"], podproc.Systemd), "spiffe://cluster.local/ns/"+ns+"/sa/payments"; got != want {
		t.Errorf("pay-0 got %q, want %q", got, want)
	}
	// A file resource is refused before any file is read.
	if got := fetchAsPod(t, sock, uid["cart-0"], podproc.Cgroupfs, "file-cert:/etc/hostname~/etc/hostname"); !strings.Contains(got, "InvalidArgument") || strings.Contains(got, "certificate chain") {
		t.Errorf("a file resource in node mode got %q, want InvalidArgument without reading the files", got)
	}
	if got := fetchAsPod(t, sock, uid["far-0"], podproc.Cgroupfs); !strings.Contains(got, "PermissionDenied") || !strings.Contains(got, "not known on this node") {
		t.Errorf("pod of another node got %q, want PermissionDenied", got)
	}

	// /debug/certs lists each identity with how many pods use it, never
	// their names.
	code, body := httpGet(t, base+"/debug/certs")
	if code != 200 {
		t.Fatalf("/debug/certs: %d %s", code, body)
	}
	var certs []status.CertInfo
	if err := json.Unmarshal([]byte(body), &certs); err != nil {
		t.Fatalf("/debug/certs: %v\n%s", err, body)
	}
	pods := map[string]int{}
	for _, c := range certs {
		if c.ResourceName == "default" {
			pods[c.Identity] = c.Pods
		}
	}
	cartID, payID := "spiffe://cluster.local/ns/"+ns+"/sa/cart", "spiffe://cluster.local/ns/"+ns+"/sa/payments"
	if got := pods[cartID]; got != 1 {
		t.Errorf("/debug/certs: %s used by %d pods, want 1\n%s", cartID, got, body)
	}
	if got := pods[payID]; got != 1 {
		t.Errorf("/debug/certs: %s used by %d pods, want 1\n%s", payID, got, body)
	}
	if strings.Contains(body, "cart-0") || strings.Contains(body, "pay-0") {
		t.Errorf("/debug/certs names pods:\n%s", body)
	}
	// Metrics per identity, never per pod.
	_, metrics := httpGet(t, base+"/metrics")
	for _, want := range []string{
		`meshagent_node_identity_pods{identity="` + cartID + `"} 1`,
		`meshagent_node_identity_pods{identity="` + payID + `"} 1`,
		`meshagent_node_identity_cert_expiry_timestamp_seconds{identity="` + cartID + `"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(metrics, "cart-0") || strings.Contains(metrics, "pay-0") {
		t.Errorf("/metrics names pods")
	}
	cancel()
	if code := wait(); code != exitOK {
		t.Errorf("exit %d; log:\n%s", code, log)
	}
}

// TestNodeModeFileResourcesAllowed: with MESHAGENT_NODE_FILE_RESOURCES a
// pod may read a certificate pair of the node by naming its files.
func TestNodeModeFileResourcesAllowed(t *testing.T) {
	kube := kubeEnv(t)
	dir := t.TempDir()
	t.Chdir(dir)
	ctx := context.Background()
	ns := fmt.Sprintf("node-files-%d", time.Now().UnixNano())
	if _, err := kube.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CreateServiceAccount(ctx, ns, "cart"); err != nil {
		t.Fatal(err)
	}
	pod, err := kube.CreatePod(ctx, ns, "cart-0", "cart", "node-files")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := localca.New(localca.Config{Name: "node files test root"})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	fileID := pki.SPIFFEIdentity("cluster.local", "files", "shared")
	chain, err := ca.Issue(localca.Leaf{PublicKey: key.Public(), Identity: fileID})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certPath, pki.EncodeCertificates(chain), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := kube.Kubeconfig(kubeconfig, kube.AdminToken()); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	base, wait, log := startAgent(t, runCtx, []string{
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", "MESHAGENT_DEV=true",
		"MESHAGENT_MODE=node", "NODE_NAME=node-files", "KUBECONFIG=" + kubeconfig,
		"MESHAGENT_NODE_FILE_RESOURCES=true", "MESHAGENT_FILE_RESOURCE_DIRS=" + dir,
	})
	if code, body := waitReady(t, base); code != 200 {
		t.Fatalf("ready: %d %q; log:\n%s", code, body, log)
	}
	sock := filepath.Join(dir, "var/run/secrets/workload-spiffe-uds/socket")
	if got := fetchAsPod(t, sock, string(pod.UID), podproc.Cgroupfs, "file-cert:"+certPath+"~"+keyPath); got != fileID.SPIFFEID {
		t.Errorf("file resource with MESHAGENT_NODE_FILE_RESOURCES=true: got %q, want the file's certificate %s", got, fileID)
	}
	// The pod's own identity is still its own.
	if got, want := fetchAsPod(t, sock, string(pod.UID), podproc.Cgroupfs), "spiffe://cluster.local/ns/"+ns+"/sa/cart"; got != want {
		t.Errorf("default: got %q, want %q", got, want)
	}
	if !strings.Contains(log.String(), "any pod on the node can read the files") {
		t.Errorf("no warning that files are served to every pod; log:\n%s", log)
	}
	cancel()
	if code := wait(); code != exitOK {
		t.Errorf("exit %d; log:\n%s", code, log)
	}
}

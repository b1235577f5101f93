package istio

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istiod"
	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// workload is one meshed pod of a test: a namespace of its own, the pod's
// service account (allowed to create tokens for itself, as the chart's
// sidecar RBAC allows) and the pod, and the agent's working directory with
// istiod's root as published in the namespace.
type workload struct {
	env  *kubeenv.Env
	ca   *istiod.Istiod
	ns   string
	sa   string
	pod  *corev1.Pod
	dir  string
	root []byte // istiod's ConfigMap istio-ca-root-cert in ns
}

// uniq is a name no other test (or run) uses.
func uniq(prefix string) string { return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1e9) }

func newWorkload(t *testing.T, sa, node string) *workload {
	t.Helper()
	ca := control(t)
	return newWorkloadIn(t, kube.Env(t), ca, uniq("mesh"), sa, node)
}

// newWorkloadIn is newWorkload in namespace ns (made if missing) of
// another API server and istiod.
func newWorkloadIn(t *testing.T, env *kubeenv.Env, ca *istiod.Istiod, ns, sa, node string) *workload {
	t.Helper()
	ctx := context.Background()
	w := &workload{env: env, ca: ca, ns: ns, sa: sa, dir: agentproc.TempDir(t)}
	if _, err := env.CreateNamespace(ctx, w.ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.CreateServiceAccount(ctx, w.ns, sa); err != nil {
		t.Fatal(err)
	}
	if err := env.GrantOwnTokens(context.Background(), w.ns, sa); err != nil {
		t.Fatal(err)
	}
	pod, err := env.CreatePod(ctx, w.ns, sa+"-0", sa, node)
	if err != nil {
		t.Fatal(err)
	}
	w.pod = pod
	// istiod publishes its root in every namespace it sees; the agent's CA
	// root file is that ConfigMap, as the injector mounts it.
	testwait.Within(t, 30*time.Second, "istiod to publish its root in "+w.ns, func() bool {
		w.root, err = ca.Roots(ctx, w.ns)
		return err == nil
	})
	if err := os.WriteFile(filepath.Join(w.dir, "root-cert.pem"), w.root, 0o600); err != nil {
		t.Fatal(err)
	}
	// The agent's own credentials for the API server: a token of the pod's
	// service account with the API's audience, bound to the pod.
	apiTok, err := env.Token(ctx, w.ns, sa, nil, pod, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Kubeconfig(filepath.Join(w.dir, "kubeconfig"), apiTok); err != nil {
		t.Fatal(err)
	}
	return w
}

// id is the workload's SPIFFE ID.
func (w *workload) id() string {
	return "spiffe://" + istiod.TrustDomain + "/ns/" + w.ns + "/sa/" + w.sa
}

// nodeID is the xDS node of the workload's proxy, as pilot-agent builds it.
func (w *workload) nodeID() string {
	return "sidecar~127.0.0.1~" + w.pod.Name + "." + w.ns + "~" + w.ns + ".svc.cluster.local"
}

// agent is one running meshagent and its status server.
type agent struct {
	*agentproc.Proc
	status string // http://127.0.0.1:<port>
}

// startSidecar runs the built agent as the injector's sidecar would: istiod
// as CA and control plane (PROXY_CONFIG's discoveryAddress, ISTIOD_SAN), a
// pod-bound TokenRequest token of the pod's service account (audience
// istio-ca), istiod's published root as CA root. extra overrides.
func (w *workload) startSidecar(t *testing.T, extra ...string) *agent {
	t.Helper()
	port := freePort(t)
	proxyConfig, err := json.Marshal(map[string]any{"discoveryAddress": w.ca.SecureAddr})
	if err != nil {
		t.Fatal(err)
	}
	env := append([]string{
		"STATUS_PORT=" + strconv.Itoa(port),
		"MESHAGENT_STATUS_HOST=127.0.0.1",
		"MESHAGENT_LOG_LEVEL=debug",
		"CA_ADDR=" + w.ca.SecureAddr,
		"ISTIOD_SAN=" + istiod.ServerName,
		"CA_ROOT_CA=" + filepath.Join(w.dir, "root-cert.pem"),
		"PROXY_CONFIG=" + string(proxyConfig),
		"ISTIO_META_CLUSTER_ID=" + istiod.ClusterID,
		"POD_NAMESPACE=" + w.ns,
		"SERVICE_ACCOUNT=" + w.sa,
		"POD_NAME=" + w.pod.Name,
		"POD_UID=" + string(w.pod.UID),
		"CREDENTIAL_FETCHER_TYPE=TokenRequest",
		"KUBECONFIG=" + filepath.Join(w.dir, "kubeconfig"),
		"MESHAGENT_TOKEN_PATH=" + filepath.Join(w.dir, "no-token-file"),
	}, extra...)
	a := &agent{Proc: agentproc.Start(t, w.dir, env...), status: "http://127.0.0.1:" + strconv.Itoa(port)}
	return a
}

// get is one GET on the agent's status server: the code and body, or 0 and
// the error.
func (a *agent) get(path string) (int, string) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(a.status + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// waitReady waits until /healthz/ready answers 200, failing the test with
// the last answer after within or if the agent exits.
func (a *agent) waitReady(t *testing.T, within time.Duration) {
	t.Helper()
	testwait.Within(t, within, "the agent ready", func() bool {
		code, body := a.get("/healthz/ready")
		if code == http.StatusOK {
			return true
		}
		if a.ExitCode() >= 0 {
			t.Fatalf("agent exited (%d) before it was ready: %d %s", a.ExitCode(), code, body)
		}
		return false
	})
}

// waitFiles waits until the agent has written every one of paths, failing
// the test after within or if the agent exits. A proxyless agent is ready
// only once its xDS proxy's upstream has answered, which takes a client: the
// gRPC application starts from the files.
func (a *agent) waitFiles(t *testing.T, within time.Duration, paths ...string) {
	t.Helper()
	testwait.Within(t, within, fmt.Sprintf("the agent to write %v", paths), func() bool {
		missing := ""
		for _, p := range paths {
			if _, err := os.Stat(p); err != nil {
				missing = p
				break
			}
		}
		if missing == "" {
			return true
		}
		if a.ExitCode() >= 0 {
			t.Fatalf("agent exited (%d) before writing %s", a.ExitCode(), missing)
		}
		return false
	})
}

// proxylessFiles are the files a proxyless agent in dir writes for gRPC.
func proxylessFiles(dir string) []string {
	return []string{filepath.Join(dir, "grpc-bootstrap.json"), filepath.Join(dir, "certs", "cert-chain.pem"),
		filepath.Join(dir, "certs", "key.pem"), filepath.Join(dir, "certs", "root-cert.pem")}
}

// fetch is one SDS Fetch of names on the agent's socket.
func (a *agent) fetch(t *testing.T, names ...string) *sdsclient.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := c.Fetch(ctx, names...)
	if err != nil {
		t.Fatalf("SDS fetch of %v: %v", names, err)
	}
	return resp
}

// parseCerts parses every certificate of a PEM bundle, failing on anything else.
func parseCerts(t *testing.T, what string, b []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			if strings.TrimSpace(string(rest)) != "" {
				t.Fatalf("%s: trailing bytes that are not PEM", what)
			}
			break
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no certificate", what)
	}
	return out
}

// verifyChain checks that chain's leaf is issued for id and verifies to roots.
func verifyChain(t *testing.T, chain, roots []byte, id string) *x509.Certificate {
	t.Helper()
	certs := parseCerts(t, "chain", chain)
	leaf := certs[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id {
		t.Fatalf("leaf URI SANs %v, want exactly %s", leaf.URIs, id)
	}
	pool := x509.NewCertPool()
	for _, r := range parseCerts(t, "roots", roots) {
		pool.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("leaf for %s does not verify to istiod's roots: %v", id, err)
	}
	return leaf
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// workloadAPIBundle fetches the trust domain's X.509 bundle over the SPIFFE
// Workload API on socket (go-spiffe's client), as PEM.
func workloadAPIBundle(socket string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	set, err := workloadapi.FetchX509Bundles(ctx, workloadapi.WithAddr("unix://"+socket))
	if err != nil {
		return nil, err
	}
	td, err := spiffeid.TrustDomainFromString(istiod.TrustDomain)
	if err != nil {
		return nil, err
	}
	b, ok := set.Get(td)
	if !ok {
		return nil, fmt.Errorf("no bundle for %s", td)
	}
	var out []byte
	for _, c := range b.X509Authorities() {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out, nil
}

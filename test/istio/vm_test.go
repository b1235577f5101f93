package istio

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	pb "istio.io/api/security/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istiod"
	"github.com/meshagent/meshagent/test/kubeenv"
)

// TestVMAfterTokenRevokedWithIstiod: the VM shape of docs/vm.md
// (PROV_CERT = OUTPUT_CERTS, a token file, no Envoy) against istiod with a
// plug-in CA. The onboarding token is a TokenRequest token bound to a
// Secret; the agent gets its first certificate with it, then the Secret is
// deleted, and istiod refuses the token (a CSR carrying only the token is
// Unauthenticated). From then on the workload certificate is all the agent
// has: istiod restarts and the agent's xDS proxy reconnects (the stream an
// application holds and a new one are both answered), the certificate is
// renewed, and through a plug-in root rotation (A; then A and B, B
// signing, before istiod restarts and after; then B alone, istiod
// restarted) renewals and xDS go on. After each restart istiod counts and
// logs no authentication failure.
func TestVMAfterTokenRevokedWithIstiod(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server, istiod and the built agent")
	}
	ctx := context.Background()
	rootA, rootB := newCA(t, "root A", nil), newCA(t, "root B", nil)
	interA, interB := newCA(t, "istiod A", rootA), newCA(t, "istiod B", rootB)
	env, ca := vmIstiod(t, interA, rootA)
	const ns, sa = vmNamespace, vmAccount
	id := vmID
	// The onboarding token: audience istio-ca, bound to a Secret whose
	// deletion revokes it (the API server's TokenReview checks that the
	// object it is bound to still exists).
	secret, err := env.Client().CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: vmName + "-onboarding"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seconds := int64(3600)
	tr, err := env.Client().CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences: []string{istiod.Audience}, ExpirationSeconds: &seconds,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: secret.Name, UID: secret.UID},
		}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := tr.Status.Token

	dir, roots := vmDir(t, env, ca, ns, sa)
	if err := os.WriteFile(filepath.Join(dir, "istio-token"), []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tokenCSR(ctx, ca, roots, token, id); err != nil {
		t.Fatalf("istiod refuses the onboarding token before it is revoked: %v", err)
	}

	vma := startVM(t, ca, dir, ns, sa, vmName)
	a := vma.Proc
	renewed := func(what string, last *x509.Certificate, signer *istiod.CA) *x509.Certificate {
		t.Helper()
		return vma.renewed(t, what, last, signer, id)
	}
	leaf := renewed("first certificate, with the token", nil, interA)

	// An application's ADS stream through the agent's xDS proxy, held for
	// the whole test; every answer is ACKed and timed.
	socket, node, out := vma.socket(), vmNode(ns, sa, vmName), vma.out()
	held := holdADS(t, socket, node)
	if _, err := held.answerAfter(time.Time{}, 60*time.Second); err != nil {
		t.Fatalf("the held ADS stream: %v\nagent logs:\n%s", err, a.Logs())
	}

	// The token is revoked: istiod refuses it from now on.
	revoked := time.Now()
	if err := env.Client().CoreV1().Secrets(ns).Delete(ctx, secret.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Each look is a CSR to istiod and a TokenReview at the API server:
	// paced at 500 ms, not at testwait's pause (300 CSRs in 10 s).
	deadline := time.Now().Add(60 * time.Second)
	probes := 0
	for {
		probes++
		err := tokenCSR(ctx, ca, roots, token, id)
		if status.Code(err) == codes.Unauthenticated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("istiod still answers a CSR with the revoked token %v after its Secret was deleted: %v", time.Since(revoked), err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("istiod refuses the onboarding token %v after its Secret was deleted (%d direct CSRs)", time.Since(revoked).Round(time.Millisecond), probes)

	// restart restarts istiod and shows that the held stream is answered
	// again and a new stream through the proxy is answered; it returns
	// istiod's log offset before the restart.
	restart := func(what string) int {
		t.Helper()
		logFrom := len(ca.Log())
		stopping := time.Now()
		if err := ca.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		ready := time.Now()
		at, err := held.answerAfter(stopping, 60*time.Second)
		if err != nil {
			t.Fatalf("%s: the held ADS stream: %v\nagent logs:\n%s\n%s", what, err, a.Logs(), ca.LogTail())
		}
		took, err := newADSAnswer(socket, node, 60*time.Second)
		if err != nil {
			t.Fatalf("%s: a new ADS stream: %v\nagent logs:\n%s\n%s", what, err, a.Logs(), ca.LogTail())
		}
		t.Logf("%s: istiod down and ready again in %v; the held stream answered %v after istiod was ready; a new stream answered in %v",
			what, ready.Sub(stopping).Round(time.Millisecond), at.Sub(ready).Round(time.Millisecond), took.Round(time.Millisecond))
		return logFrom
	}
	// authenticated checks, once a renewal is done after a restart, that
	// istiod counted no authentication failure and logged none since logFrom.
	authenticated := func(what string, logFrom int) {
		t.Helper()
		csrs, issued, failures := istiodMetric(t, ca, "citadel_server_csr_count"),
			istiodMetric(t, ca, "citadel_server_success_cert_issuance_count"),
			istiodMetric(t, ca, "citadel_server_authentication_failure_count")
		t.Logf("%s: istiod since its restart: %v CSRs, %v certificates issued, %v authentication failures", what, csrs, issued, failures)
		if failures != 0 || issued < 1 {
			t.Errorf("%s: istiod counted %v authentication failures and %v certificates issued since its restart, want 0 and at least 1", what, failures, issued)
		}
		if l := ca.Log()[logFrom:]; strings.Contains(l, "Failed to authenticate client") {
			t.Errorf("%s: istiod refused a client since its restart:\n%s", what, grepLines(l, "Failed to authenticate client"))
		}
	}

	// istiod restarts: a new xDS connection, a new CA connection, each
	// authenticated by the certificate alone.
	logFrom := restart("token revoked, istiod restarted")
	leaf = renewed("token revoked, renewal", leaf, interA)
	authenticated("token revoked", logFrom)

	// Root rotation, step 1: istiod signs with B and publishes A and B. The
	// running istiod still checks client certificates against A alone; the
	// agent's connections made before go on.
	if err := ca.SetPluginCA(istiod.Plugin(interB, rootB, rootA, rootB)); err != nil {
		t.Fatal(err)
	}
	leaf = renewed("roots A and B, istiod not restarted: renewal", leaf, interB)
	took, err := newADSAnswer(socket, node, 60*time.Second)
	if err != nil {
		t.Fatalf("roots A and B: a new ADS stream: %v\nagent logs:\n%s", err, a.Logs())
	}
	t.Logf("roots A and B, istiod not restarted: a new ADS stream answered in %v", took.Round(time.Millisecond))
	logFrom = restart("roots A and B, istiod restarted")
	leaf = renewed("roots A and B: renewal", leaf, interB)
	authenticated("roots A and B", logFrom)

	// Step 2: B alone.
	if err := ca.SetPluginCA(istiod.Plugin(interB, rootB, rootB)); err != nil {
		t.Fatal(err)
	}
	waitRootFile(t, filepath.Join(out, files.RootCertFile), rootB)
	logFrom = restart("root B, istiod restarted")
	renewed("root B: renewal", leaf, interB)
	authenticated("root B", logFrom)
}

// TestVMRootRotatedToSameSubjectWithIstiod: the plug-in root is rotated to
// a new root with the old root's subject (as Istio's certificate tooling
// makes them), and the VM's certificate is renewed from the new root before
// istiod restarts. istiod still checks client certificates against the old
// root alone, but names its subject among the CAs it accepts, so the agent
// offers the new certificate and istiod refuses the handshake. The agent
// restarts (every connection new): its next handshakes leave the refused
// certificate out, and its still valid onboarding token authenticates a new
// xDS stream and a renewal.
func TestVMRootRotatedToSameSubjectWithIstiod(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server, istiod and the built agent")
	}
	ctx := context.Background()
	rootA, rootB := newCA(t, "root", nil), newCA(t, "root", nil)
	if !bytes.Equal(rootA.Cert.RawSubject, rootB.Cert.RawSubject) {
		t.Fatal("the two roots' subjects differ")
	}
	interA, interB := newCA(t, "istiod A", rootA), newCA(t, "istiod B", rootB)
	env, ca := vmIstiod(t, interA, rootA)
	const ns, sa = vmNamespace, vmAccount
	id := vmID
	token, err := env.Token(ctx, ns, sa, []string{istiod.Audience}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := vmDir(t, env, ca, ns, sa)
	if err := os.WriteFile(filepath.Join(dir, "istio-token"), []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	vma := startVM(t, ca, dir, ns, sa, vmName)
	leaf := vma.renewed(t, "first certificate", nil, interA, id)

	// Rotation: istiod signs with B and publishes A and B, not restarted.
	if err := ca.SetPluginCA(istiod.Plugin(interB, rootB, rootA, rootB)); err != nil {
		t.Fatal(err)
	}
	leaf = vma.renewed(t, "roots A and B, istiod not restarted: renewal", leaf, interB, id)

	// Every connection anew, the certificate of B on disk.
	vma.restart(t)
	// Until that certificate expires it is what the agent holds; once it
	// has expired it is offered no more and the token speaks anyway.
	expires := leaf.NotAfter
	took, err := newADSAnswer(vma.socket(), vmNode(ns, sa, vmName), time.Until(expires))
	if err != nil {
		t.Fatalf("the agent restarted: no answer on a new ADS stream before the certificate of B expired: %v\nagent logs:\n%s", err, vma.Logs())
	}
	t.Logf("the agent restarted holding a certificate of the same-subject root B: a new ADS stream answered in %v (the certificate had %v left)",
		took.Round(time.Millisecond), time.Until(expires).Round(time.Second))
	vma.renewed(t, "the agent restarted: renewal", leaf, interB, id)
	if time.Now().After(expires) {
		t.Fatalf("the agent restarted: renewed only once the certificate of B had expired")
	}
	// The refusal, as the restarted agent saw it: its first handshakes
	// offered the certificate of B and failed.
	refused := strings.Count(vma.Logs(), `"msg":"CA request failed"`)
	t.Logf("the restarted agent's CA requests refused at the handshake before the token spoke: %d", refused)
	if refused == 0 {
		t.Errorf("no CA request of the restarted agent failed: the certificate of root B was not offered, and the test shows nothing")
	}
}

// The VM of the tests against istiod: its namespace, service account, name
// and SPIFFE ID.
const (
	vmNamespace = "billing"
	vmAccount   = "billing-vm"
	vmName      = "billing-vm-1"
	vmID        = "spiffe://" + istiod.TrustDomain + "/ns/" + vmNamespace + "/sa/" + vmAccount
)

// vmIstiod starts an API server and istiod with the plug-in CA inter under
// root, and makes the VM's namespace and service account; both stop when
// the test ends.
func vmIstiod(t *testing.T, inter, root *istiod.CA) (*kubeenv.Env, *istiod.Istiod) {
	t.Helper()
	ctx := context.Background()
	env, err := kubeenv.Start(ctx, kubeenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Stop() })
	ca, err := istiod.Start(ctx, istiod.APIOf(env), istiod.Options{PluginCA: ptr(istiod.Plugin(inter, root, root))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ca.Stop() })
	if _, err := env.CreateNamespace(ctx, vmNamespace); err != nil {
		t.Fatal(err)
	}
	if _, err := env.CreateServiceAccount(ctx, vmNamespace, vmAccount); err != nil {
		t.Fatal(err)
	}
	return env, ca
}

// vmDir makes the VM's directory: /etc/meshagent/root-cert.pem as istiod
// publishes it in ns, kept so by a copy (the operator's part during a
// rotation, docs/vm.md) until the test ends. It returns the directory and
// the roots first published.
func vmDir(t *testing.T, env *kubeenv.Env, ca *istiod.Istiod, ns, sa string) (string, []byte) {
	t.Helper()
	vm := &workload{env: env, ca: ca, ns: ns, sa: sa, dir: agentproc.TempDir(t)}
	testwait.Within(t, 30*time.Second, "istiod to publish its root in "+ns, func() bool {
		var err error
		vm.root, err = ca.Roots(context.Background(), ns)
		return err == nil
	})
	if err := os.WriteFile(filepath.Join(vm.dir, "root-cert.pem"), vm.root, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(syncRoots(t, env, vm))
	return vm.dir, vm.root
}

// vmTTL is the VM's SECRET_TTL in these tests: a renewal every 15 s or so.
const vmTTL = 30 * time.Second

// vmAgent is the built agent run as docs/vm.md sets it up on a VM.
type vmAgent struct {
	*agentproc.Proc
	env []string
}

// startVM runs the agent in dir with docs/vm.md's settings for the VM name
// of service account sa of ns: its CA root and token files in dir, PROV_CERT
// = OUTPUT_CERTS = dir/certs, SECRET_TTL vmTTL, no Envoy. ISTIOD_SAN because
// istiod is reached by a loopback address here.
func startVM(t *testing.T, ca *istiod.Istiod, dir, ns, sa, name string) *vmAgent {
	t.Helper()
	proxyConfig, err := json.Marshal(map[string]any{"discoveryAddress": ca.SecureAddr})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "certs")
	env := []string{
		"TRUST_DOMAIN=" + istiod.TrustDomain,
		"POD_NAMESPACE=" + ns,
		"SERVICE_ACCOUNT=" + sa,
		"POD_NAME=" + name,
		"ISTIO_META_CLUSTER_ID=" + istiod.ClusterID,
		"PROXY_CONFIG=" + string(proxyConfig),
		"ISTIOD_SAN=" + istiod.ServerName,
		"CA_ROOT_CA=" + filepath.Join(dir, "root-cert.pem"),
		"MESHAGENT_TOKEN_PATH=" + filepath.Join(dir, "istio-token"),
		"OUTPUT_CERTS=" + out,
		"PROV_CERT=" + out,
		"SECRET_TTL=" + vmTTL.String(),
		"DISABLE_ENVOY=true",
		"GRPC_XDS_BOOTSTRAP=" + filepath.Join(dir, "grpc-bootstrap.json"),
		"MESHAGENT_STATUS_HOST=127.0.0.1",
		"STATUS_PORT=" + strconv.Itoa(freePort(t)),
		"MESHAGENT_LOG_LEVEL=debug",
	}
	return &vmAgent{Proc: agentproc.Start(t, dir, env...), env: env}
}

// restart stops the agent and starts it again with the same settings, as
// systemd restarts it.
func (v *vmAgent) restart(t *testing.T) {
	t.Helper()
	v.Stop()
	v.Proc = agentproc.Start(t, v.Dir, v.env...)
}

func (v *vmAgent) out() string    { return filepath.Join(v.Dir, "certs") }
func (v *vmAgent) socket() string { return filepath.Join(v.Dir, "etc/istio/proxy/XDS") }

// leaf is the certificate in OUTPUT_CERTS now, nil without one.
func (v *vmAgent) leaf() *x509.Certificate {
	b, err := os.ReadFile(filepath.Join(v.out(), files.CertChainFile))
	if err != nil {
		return nil
	}
	leaf, err := firstCert(b)
	if err != nil {
		return nil
	}
	return leaf
}

// renewed waits for a leaf other than last in OUTPUT_CERTS, issued for id
// by signer, and returns it.
func (v *vmAgent) renewed(t *testing.T, what string, last *x509.Certificate, signer *istiod.CA, id string) *x509.Certificate {
	t.Helper()
	start := time.Now()
	var leaf *x509.Certificate
	testwait.Within(t, 2*vmTTL+30*time.Second, what+": a new certificate from "+signer.Cert.Subject.CommonName+" in OUTPUT_CERTS", func() bool {
		leaf = v.leaf()
		if leaf != nil && (last == nil || !leaf.Equal(last)) && leaf.CheckSignatureFrom(signer.Cert) == nil {
			return true
		}
		if v.ExitCode() >= 0 {
			t.Fatalf("%s: agent exited (%d)", what, v.ExitCode())
		}
		return false
	})
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id {
		t.Fatalf("%s: leaf for %v, want %s", what, leaf.URIs, id)
	}
	t.Logf("%s: certificate (serial %x, from %s) in OUTPUT_CERTS %v after the test began to wait", what, leaf.SerialNumber,
		signer.Cert.Subject.CommonName, time.Since(start).Round(time.Millisecond))
	return leaf
}

// tokenCSR is one CSR for id sent straight to istiod's CA with token as its
// only credential (no client certificate), as the VM's first request is.
func tokenCSR(ctx context.Context, ca *istiod.Istiod, roots []byte, token, id string) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(roots) {
		return fmt.Errorf("no roots")
	}
	conn, err := grpc.NewClient("passthrough:///"+ca.SecureAddr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{RootCAs: pool, ServerName: istiod.ServerName, MinVersion: tls.VersionTLS12})))
	if err != nil {
		return err
	}
	defer conn.Close()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := pki.NewCSR(key, pki.Identity{SPIFFEID: id})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token, "ClusterID", istiod.ClusterID)
	_, err = pb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx,
		&pb.IstioCertificateRequest{Csr: string(pki.EncodeCSRPEM(der)), ValidityDuration: 60})
	return err
}

// vmNode is the xDS node of the VM's Envoy, as pilot-agent describes it.
func vmNode(ns, sa, name string) *corev3.Node {
	md, _ := structpb.NewStruct(map[string]any{
		"NAMESPACE":       ns,
		"SERVICE_ACCOUNT": sa,
		"CLUSTER_ID":      istiod.ClusterID,
		"ISTIO_VERSION":   "1.31-dev",
		"LABELS":          map[string]any{"app": sa},
		"WORKLOAD_NAME":   sa,
		"INSTANCE_IPS":    "127.0.0.1",
	})
	return &corev3.Node{Id: "sidecar~127.0.0.1~" + name + "." + ns + "~" + ns + ".svc.cluster.local", Cluster: sa + "." + ns, Metadata: md}
}

// heldADS is one ADS stream on the agent's xDS socket asking for clusters,
// every answer ACKed and its arrival recorded.
type heldADS struct {
	mu      sync.Mutex
	answers []time.Time
	err     error
	changed chan struct{} // closed and replaced at every answer or error
}

func holdADS(t *testing.T, socket string, node *corev3.Node) *heldADS {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	h := &heldADS{changed: make(chan struct{})}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		err := func() error {
			stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx, grpc.WaitForReady(true))
			if err != nil {
				return err
			}
			if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}); err != nil {
				return err
			}
			for {
				resp, err := stream.Recv()
				if err != nil {
					return err
				}
				h.record(nil)
				if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(),
					VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
					return err
				}
			}
		}()
		if ctx.Err() == nil {
			h.record(err)
		}
	}()
	return h
}

func (h *heldADS) record(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.err = err
	} else {
		h.answers = append(h.answers, time.Now())
	}
	close(h.changed)
	h.changed = make(chan struct{})
}

// answerAfter waits for an answer that arrived after since and returns when
// it arrived.
func (h *heldADS) answerAfter(since time.Time, within time.Duration) (time.Time, error) {
	timeout := time.After(within)
	for {
		h.mu.Lock()
		for _, at := range h.answers {
			if at.After(since) {
				h.mu.Unlock()
				return at, nil
			}
		}
		err, changed := h.err, h.changed
		h.mu.Unlock()
		if err != nil {
			return time.Time{}, fmt.Errorf("the stream ended: %w", err)
		}
		select {
		case <-changed:
		case <-timeout:
			return time.Time{}, fmt.Errorf("no answer within %v", within)
		}
	}
}

// newADSAnswer opens a new connection and ADS stream on the agent's xDS
// socket, asks for clusters and returns how long the first answer took.
func newADSAnswer(socket string, node *corev3.Node, within time.Duration) (time.Duration, error) {
	start := time.Now()
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx, grpc.WaitForReady(true))
	if err != nil {
		return 0, err
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}); err != nil {
		return 0, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return 0, err
	}
	if resp.GetTypeUrl() != resourcev3.ClusterType || len(resp.GetResources()) == 0 {
		return 0, fmt.Errorf("answer of type %s with %d resources, want clusters", resp.GetTypeUrl(), len(resp.GetResources()))
	}
	return time.Since(start), nil
}

// waitRootFile waits until path holds exactly root.
func waitRootFile(t *testing.T, path string, root *istiod.CA) {
	t.Helper()
	testwait.Within(t, 60*time.Second, path+" to hold "+root.Cert.Subject.CommonName+" alone", func() bool {
		b, err := os.ReadFile(path)
		return err == nil && sameCerts(b, []*istiod.CA{root}) == nil
	})
}

// istiodMetric is the value of the counter name (without labels) on
// istiod's /metrics, 0 when absent.
func istiodMetric(t *testing.T, ca *istiod.Istiod, name string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ca.MonitoringAddr+"/metrics", nil)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(?:\{[^}]*\})? ([0-9.e+]+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

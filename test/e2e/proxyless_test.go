//go:build e2e

package e2e

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/meshagent/meshagent/test/istiod"
)

const grpcNamespace = "e2e-grpc"

// proxylessTTL is the proxyless agents' certificate lifetime (SECRET_TTL): they
// renew at half of it, and gRPC re-reads the files every tenth of it.
const proxylessTTL = 60 * time.Second

// echoLine is one line of an xdsecho client's log (test/e2e/images/xdsecho).
type echoLine struct {
	Time            time.Time `json:"time"`
	Kind            string    `json:"kind"`
	OK              bool      `json:"ok"`
	Code            string    `json:"code"`
	Error           string    `json:"error"`
	ServerID        string    `json:"server_id"`
	ServerIssuer    string    `json:"server_issuer"`
	ClientID        string    `json:"client_id"`
	Calls           int       `json:"calls"`
	Failures        int       `json:"failures"`
	FailuresAfterOK int       `json:"failures_after_ok"`
	// Pod is the name of the pod whose log holds the line.
	Pod string `json:"-"`
}

// proxylessRelease installs the chart's proxyless shape (no Envoy, the xDS
// proxy on) for one xdsecho workload, istiod as CA and control plane.
func proxylessRelease(t *testing.T, rel, app string, args, env string, ttl time.Duration) {
	t.Helper()
	values := filepath.Join(t.TempDir(), rel+".yaml")
	if err := os.WriteFile(values, []byte(`image:
  pullPolicy: Never
caAddress: "`+istiodAddr+`"
discoveryAddress: "`+istiodAddr+`"
istiodSAN: `+caServerName+`
# Short-lived certificates: the root rotation of the test sees them renewed.
extraEnv:
  - name: SECRET_TTL
    value: `+ttl.String()+`
sidecar:
  envoy:
    enabled: false
  xdsProxy: true
  podLabels:
    app: `+app+`
  containers:
    - name: app
      image: `+xdsechoImage+`
      imagePullPolicy: Never
      args: [`+args+`]
      env:
`+env+`
      securityContext:
        allowPrivilegeEscalation: false
        capabilities:
          drop: [ALL]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "helm", "install", rel, filepath.Join(repoRoot(), "deploy", "helm", "meshagent"),
		"--namespace", grpcNamespace, "--values", values)
}

// echoLines reads the xdsecho client's call lines of the pods of app.
func echoLines(t *testing.T, app string) []echoLine {
	t.Helper()
	pods, err := kube.Client().CoreV1().Pods(grpcNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	var out []echoLine
	for _, p := range pods.Items {
		for _, l := range jsonLines(&p, "app", func(l echoLine) bool { return l.Kind == "call" }) {
			l.Pod = p.Name
			out = append(out, l)
		}
	}
	return out
}

// waitCall waits for a call line after since that ok accepts.
func waitCall(t *testing.T, what string, since time.Time, ok func(echoLine) bool) echoLine {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var last echoLine
	for {
		for _, l := range echoLines(t, "client") {
			if l.Time.After(since) {
				last = l
				if ok(l) {
					return l
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 3 minutes; last call: %+v\nclient agent log:\n%s", what, last, tail(releaseLog(t, "client", "meshagent"), 3000))
		}
		time.Sleep(time.Second)
	}
}

func releaseLog(t *testing.T, app, container string) string {
	pods, err := kube.Client().CoreV1().Pods(grpcNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil || len(pods.Items) == 0 {
		return "(no pod)"
	}
	return containerLog(&pods.Items[0], container)
}

// startProxylessMesh installs the two proxyless workloads of grpcNamespace (an
// xdsecho server behind the Service echo and a client calling it every 100 ms)
// with certificates of ttl, istiod holding the namespace to mTLS; the test's
// cleanup uninstalls them and deletes the namespace.
func startProxylessMesh(t *testing.T, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	controlPlane(t)
	core := kube.Client().CoreV1()
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: grpcNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoots(t, grpcNamespace)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(`apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: `+grpcNamespace+`}
spec:
  mtls: {mode: STRICT}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: mtls, namespace: `+grpcNamespace+`}
spec:
  host: "*.`+grpcNamespace+`.svc.cluster.local"
  trafficPolicy:
    tls: {mode: ISTIO_MUTUAL}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "kubectl", "apply", "-f", policy)
	if _, err := core.Services(grpcNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "echo"},
			Ports:    []corev1.ServicePort{{Name: "grpc", Port: 7070, TargetPort: intstr.FromInt32(7070), AppProtocol: ptrTo("grpc")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	proxylessRelease(t, "echo", "echo", "server", `        - {name: PORT, value: "7070"}`, ttl)
	proxylessRelease(t, "client", "client", "client",
		`        - {name: TARGET, value: "xds:///echo.`+grpcNamespace+`.svc.cluster.local:7070"}
        - {name: INTERVAL, value: "100ms"}`, ttl)
	t.Cleanup(func() {
		for _, rel := range []string{"client", "echo"} {
			_ = kube.Command(context.Background(), "helm", "uninstall", rel, "--namespace", grpcNamespace, "--wait", "--timeout", "2m").Run()
		}
		_ = core.Namespaces().Delete(context.Background(), grpcNamespace, metav1.DeleteOptions{})
		// Gone before the next test may make the namespace again.
		waitGone(t, "namespace "+grpcNamespace, func() bool {
			_, err := core.Namespaces().Get(context.Background(), grpcNamespace, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	})
}

// TestProxylessMeshWithIstiod: two proxyless gRPC workloads (grpc-go's xDS client
// and server, the chart's proxyless shape: meshagent beside each, no Envoy) in a
// namespace istiod holds to mTLS (PeerAuthentication STRICT, DestinationRule
// ISTIO_MUTUAL). Calls succeed over mTLS with istiod's certificates, each side
// seeing the other's SPIFFE ID; an AuthorizationPolicy denying the client's service
// account makes them fail with PermissionDenied, and removing it restores them.
func TestProxylessMeshWithIstiod(t *testing.T) {
	startProxylessMesh(t, proxylessTTL)
	serverID := spiffeIDIn(grpcNamespace, "echo-meshagent-workload")
	clientID := spiffeIDIn(grpcNamespace, "client-meshagent-workload")
	start := time.Now()
	first := waitCall(t, "a call over mTLS", time.Time{}, func(l echoLine) bool { return l.OK })
	if first.ServerID != serverID || first.ClientID != clientID {
		t.Fatalf("first call: the client saw %q, the server saw %q; want %s and %s over mTLS", first.ServerID, first.ClientID, serverID, clientID)
	}
	t.Logf("calls succeed over mTLS %.1fs after install: client sees %s, server sees %s", time.Since(start).Seconds(), first.ServerID, first.ClientID)

	deny := filepath.Join(t.TempDir(), "deny.yaml")
	if err := os.WriteFile(deny, []byte(`apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-client, namespace: `+grpcNamespace+`}
spec:
  selector:
    matchLabels: {app: echo}
  action: DENY
  rules:
    - from:
        - source:
            principals: ["cluster.local/ns/`+grpcNamespace+`/sa/client-meshagent-workload"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	run(t, "kubectl", "apply", "-f", deny)
	denied := waitCall(t, "PermissionDenied under the DENY policy", applied, func(l echoLine) bool { return l.Code == "PermissionDenied" })
	t.Logf("denied %.1fs after the policy: %s", denied.Time.Sub(applied).Seconds(), denied.Error)
	removed := time.Now()
	run(t, "kubectl", "delete", "-f", deny)
	back := waitCall(t, "calls again once the policy is removed", removed, func(l echoLine) bool { return l.OK })
	t.Logf("calls succeed again %.1fs after the policy was removed (server %s)", back.Time.Sub(removed).Seconds(), back.ServerID)

	rotateRoots(t, back)
}

// rotateRoots moves istiod's plug-in CA from root A to root B, publishing old and
// new together first and then the new alone, while the client calls every 100 ms.
// At each step both agents' OUTPUT_CERTS hold what istiod publishes (the
// namespace's istio-ca-root-cert, which the kubelet updates in their CA root
// volume) and a certificate of the new signer; not one call fails.
func rotateRoots(t *testing.T, before echoLine) {
	t.Helper()
	ca := controlPlane(t)
	rootB, err := istiod.NewCA("e2e root B", nil)
	if err != nil {
		t.Fatal(err)
	}
	signerB, err := istiod.NewCA("e2e istiod B", rootB)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	step := func(what string, roots []*istiod.CA, plugin istiod.PluginCA) {
		t.Helper()
		stepStart := time.Now()
		if err := ca.SetPluginCA(plugin); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(4 * time.Minute)
		for {
			err := checkProxylessFiles(t, roots, signerB)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(time.Second)
		}
		t.Logf("%s: both agents' files hold what istiod publishes and a certificate of istiod B, %.1fs after the change", what, time.Since(stepStart).Seconds())
		// gRPC re-reads the files every tenth of the lifetime: two such periods
		// later no connection uses what came before.
		time.Sleep(2 * proxylessTTL / 10)
	}
	step("roots A and B", []*istiod.CA{meshRootA, rootB}, istiod.Plugin(signerB, rootB, meshRootA, rootB))
	step("root B", []*istiod.CA{rootB}, istiod.Plugin(signerB, rootB, rootB))

	var last echoLine
	calls := 0
	for _, l := range echoLines(t, "client") {
		if l.Time.After(start) {
			last = l
			calls++
		}
	}
	if calls < 100 {
		t.Fatalf("only %d calls during the rotation", calls)
	}
	if failed := last.FailuresAfterOK - before.FailuresAfterOK; failed != 0 {
		t.Fatalf("%d of %d calls failed during the root rotation", failed, calls)
	}
	t.Logf("root rotation: %d calls every 100 ms, none failed", calls)

	// The calls kept their connection (and its handshake under root A). A new
	// client process makes a new one: under root B alone, with the server's
	// certificate of istiod B.
	replaced := time.Now()
	if err := kube.Client().CoreV1().Pods(grpcNamespace).DeleteCollection(context.Background(), metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "app=client"}); err != nil {
		t.Fatal(err)
	}
	wantIssuer := hex.EncodeToString(signerB.Cert.SubjectKeyId)
	fresh := waitCall(t, "a new client's call after the rotation", replaced, func(l echoLine) bool { return l.OK && l.Pod != last.Pod })
	if fresh.ServerIssuer != wantIssuer {
		t.Fatalf("a new connection after the rotation: server certificate issued by key %s, want istiod B's %s", fresh.ServerIssuer, wantIssuer)
	}
	t.Logf("a new client pod's first call: server certificate issued by istiod B (key %s), roots B alone", wantIssuer)
}

// checkProxylessFiles says why the proxyless pods' OUTPUT_CERTS (their istio-data
// volume, read on the node) do not yet hold exactly roots and a chain issued by
// signer; nil when they do.
func checkProxylessFiles(t *testing.T, roots []*istiod.CA, signer *istiod.CA) error {
	t.Helper()
	for _, app := range []string{"echo", "client"} {
		pods, err := kube.Client().CoreV1().Pods(grpcNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil || len(pods.Items) != 1 {
			return fmt.Errorf("%s: %d pods (%v)", app, len(pods.Items), err)
		}
		dir := filepath.Join("/var/lib/kubelet/pods", string(pods.Items[0].UID), "volumes/kubernetes.io~empty-dir/istio-data")
		b, err := os.ReadFile(filepath.Join(dir, "root-cert.pem"))
		if err != nil {
			return err
		}
		certs, err := parsePEMCerts(b)
		if err != nil {
			return fmt.Errorf("%s root-cert.pem: %w", app, err)
		}
		if len(certs) != len(roots) {
			return fmt.Errorf("%s root-cert.pem: %d roots, istiod publishes %d", app, len(certs), len(roots))
		}
		for _, r := range roots {
			if !slices.ContainsFunc(certs, r.Cert.Equal) {
				return fmt.Errorf("%s root-cert.pem: no %s", app, r.Cert.Subject.CommonName)
			}
		}
		chain, err := os.ReadFile(filepath.Join(dir, "cert-chain.pem"))
		if err != nil {
			return err
		}
		leaf, err := parsePEMCerts(chain)
		if err != nil || len(leaf) == 0 {
			return fmt.Errorf("%s cert-chain.pem: %v", app, err)
		}
		if leaf[0].CheckSignatureFrom(signer.Cert) != nil {
			return fmt.Errorf("%s cert-chain.pem: not yet issued by %s", app, signer.Cert.Subject.CommonName)
		}
	}
	return nil
}

func parsePEMCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return out, nil
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

func ptrTo[T any](v T) *T { return &v }

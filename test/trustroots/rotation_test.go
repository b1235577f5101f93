package trustroots

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	meshconfig "istio.io/api/mesh/v1alpha1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/internal/trust"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/xdsserver"
)

var workload = istioca.ServiceAccount{Namespace: "app", Name: "web"}

const workloadToken = "token-app-web"

// root is a CA whose root's common name is name.
type root struct {
	name string
	ca   *localca.CA
}

func newRoot(t *testing.T, name string) root {
	t.Helper()
	ca, err := localca.New(localca.Config{Name: name, Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	return root{name: name, ca: ca}
}

// source is a cluster trust source: the agent's setting that names it, and
// how the test publishes roots through it.
type source struct {
	name string
	// env is the agent's setting for the source in namespace ns.
	env func(ns string) string
	// publish makes the source hold exactly roots. Nil for overXDS.
	publish func(t *testing.T, env *kubeenv.Env, ns string, roots ...root)
	// overXDS: the roots come from the control plane's ProxyConfig, which
	// the test control plane serves (see rotate).
	overXDS bool
}

// proxyConfig is istiod's ProxyConfig over xDS: its caCertificatesPem,
// which the xDS proxy asks for on its own.
var proxyConfig = source{
	name:    "proxyconfig",
	env:     func(string) string { return "PROXY_CONFIG_XDS_AGENT=true" },
	overXDS: true,
}

// setProxyConfig makes xs serve a ProxyConfig whose caCertificatesPem are
// the roots.
func setProxyConfig(t *testing.T, xs *xdsserver.Server, roots []root) {
	t.Helper()
	pc := &meshconfig.ProxyConfig{}
	for _, r := range roots {
		pc.CaCertificatesPem = append(pc.CaCertificatesPem, string(r.ca.RootPEM()))
	}
	if err := xs.SetOpaque(trust.ProxyConfigTypeURL, map[string]proto.Message{"": pc}); err != nil {
		t.Fatal(err)
	}
}

var configMap = source{
	name: "configmap",
	env:  func(ns string) string { return "MESHAGENT_TRUST_CONFIGMAP=" + ns + "/istio-ca-root-cert" },
	publish: func(t *testing.T, env *kubeenv.Env, ns string, roots ...root) {
		t.Helper()
		var pem []byte
		for _, r := range roots {
			pem = append(pem, r.ca.RootPEM()...)
		}
		ctx := context.Background()
		cms := env.Client().CoreV1().ConfigMaps(ns)
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert"},
			Data:       map[string]string{"root-cert.pem": string(pem)},
		}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	},
}

// clusterTrustBundles publishes each root in a ClusterTrustBundle of its
// own, as a signer does during a rotation: the new root's bundle is made
// beside the old one, then the old one is deleted.
var clusterTrustBundles = source{
	name: "clustertrustbundle",
	env:  func(ns string) string { return "MESHAGENT_TRUST_BUNDLE_SIGNER=" + signer(ns) },
	publish: func(t *testing.T, env *kubeenv.Env, ns string, roots ...root) {
		t.Helper()
		ctx := context.Background()
		ctbs := env.Client().CertificatesV1().ClusterTrustBundles()
		prefix := strings.ReplaceAll(signer(ns), "/", ":") + ":"
		keep := map[string]bool{}
		for _, r := range roots {
			name := prefix + r.name
			keep[name] = true
			_, err := ctbs.Create(ctx, &certificatesv1.ClusterTrustBundle{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: signer(ns), TrustBundle: string(r.ca.RootPEM())},
			}, metav1.CreateOptions{})
			if err != nil && !strings.Contains(err.Error(), "already exists") {
				t.Fatal(err)
			}
		}
		list, err := ctbs.List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=" + signer(ns)})
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range list.Items {
			if !keep[b.Name] {
				if err := ctbs.Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
	},
}

func signer(ns string) string { return "meshagent.io/" + ns }

// A root rotation through each cluster source (a ConfigMap, ClusterTrustBundles,
// istiod's ProxyConfig pushed by the test control plane), with the agent binary: the
// new root is published beside the old one, reaches every place, the CA
// and the control plane move to it (new serving certificates, verified on
// new connections by the CA client and the xDS proxy), and then the old
// root is removed from the source and the root file. A peer that also moves to the new root is handshaken with
// every 100 ms, verified with each place's roots and presenting the
// workload certificate: not one handshake fails.
func TestRootRotation(t *testing.T) {
	for _, src := range []source{configMap, clusterTrustBundles, proxyConfig} {
		t.Run(src.name, func(t *testing.T) { rotate(t, src) })
	}
}

func rotate(t *testing.T, src source) {
	env := kube.Env(t)
	ns := env.TestNamespace(t)
	a, b := newRoot(t, "root-a"), newRoot(t, "root-b")
	ca := istioca.Start(t, istioca.Config{CA: a.ca, Tokens: map[string]istioca.ServiceAccount{workloadToken: workload}})

	dir := agentproc.TempDir(t)
	rootFile := filepath.Join(dir, "root-cert.pem")
	write(t, rootFile, a.ca.RootPEM())
	write(t, filepath.Join(dir, "istio-token"), []byte(workloadToken))
	// The agent acts as a service account with only the RBAC docs/trust.md
	// names.
	kc := filepath.Join(dir, "kubeconfig")
	if err := env.Kubeconfig(kc, agentToken(t, env, ns)); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	opaque := []string{trust.ProxyConfigTypeURL}
	xds := xdsserver.Start(t, xdsserver.Config{CA: a.ca, ServerNames: []string{istioca.DefaultServerName}, OpaqueTypes: opaque})
	// publish makes the source hold exactly roots; a control plane that
	// replaces xds is given the last ones.
	var published []root
	publish := func(roots ...root) {
		t.Helper()
		published = roots
		if src.overXDS {
			setProxyConfig(t, xds, roots)
			return
		}
		src.publish(t, env, ns, roots...)
	}
	publish(a)
	p := agentproc.Start(t, dir,
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", "MESHAGENT_LOG_LEVEL=debug",
		`PROXY_CONFIG={"discoveryAddress":"`+xds.Addr()+`"}`,
		"CA_ADDR="+ca.Addr(), "ISTIOD_SAN="+istioca.DefaultServerName, "CA_ROOT_CA="+rootFile,
		"POD_NAMESPACE="+workload.Namespace, "SERVICE_ACCOUNT="+workload.Name, "POD_NAME=web-0",
		"MESHAGENT_TOKEN_PATH="+filepath.Join(dir, "istio-token"),
		"SECRET_TTL=10s", "SECRET_GRACE_PERIOD_RATIO_JITTER=0",
		"OUTPUT_CERTS="+out, "KUBECONFIG="+kc, "FILE_DEBOUNCE_DURATION=50ms",
		src.env(ns),
	)
	pl := openPlaces(t, p, out)
	pl.waitRoots(t, "root-a")
	pl.waitIssuer(t, "root-a", 30*time.Second)

	openADS(t, filepath.Join(dir, "etc/istio/proxy/XDS"))
	waitUpstream(t, xds, 1, "under the old root")

	peer := startPeer(t, pl, serving(t, a, peerName))
	hs := startHandshakes(pl, peer.lis.Addr().String())

	// 1. The new root beside the old one.
	publish(a, b)
	pl.waitRoots(t, "root-a", "root-b")
	// 2. Everything moves to the new root: the peer, the CA's issuer and
	// its serving certificate (on a new connection: the CA restarts).
	peer.cert.Store(ptr(serving(t, b, peerName)))
	ca.SetIssuer(b.ca)
	ca.SetServingCert(serving(t, b, istioca.DefaultServerName))
	ca.Restart(t)
	pl.waitIssuer(t, "root-b", 30*time.Second)
	// The control plane too, on the same address: the proxy reconnects.
	xds.Stop()
	xds = xdsserver.Start(t, xdsserver.Config{CA: b.ca, ServerNames: []string{istioca.DefaultServerName}, Addr: xds.Addr(), OpaqueTypes: opaque})
	if src.overXDS {
		setProxyConfig(t, xds, published)
	}
	waitUpstream(t, xds, 1, "under the new root, with both roots trusted")
	// 3. The old root leaves the source and the root file.
	publish(b)
	write(t, rootFile, b.ca.RootPEM())
	pl.waitRoots(t, "root-b")
	// The CA and the control plane are still trusted with the new root
	// alone, on new connections.
	xds.Restart(t)
	waitUpstream(t, xds, 2, "with the new root alone")
	ca.Restart(t)
	seen := pl.workloadCert().Leaf
	if seen == nil {
		t.Fatal("no parsed workload certificate")
	}
	waitNewCert(t, pl, seen.SerialNumber.String())

	n, err := hs.finish()
	if err != nil {
		t.Fatalf("failed handshakes during the rotation (of %d):\n%v", n, err)
	}
	if n < 30 {
		t.Fatalf("only %d handshakes were made", n)
	}
	t.Logf("%d handshakes, none failed", n)
}

// serving is a TLS server certificate for name and 127.0.0.1 under r.
func serving(t *testing.T, r root, name string) tls.Certificate {
	t.Helper()
	c, err := r.ca.TLSCertificate(localca.Leaf{DNSNames: []string{name}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitNewCert waits for a workload certificate whose serial is not old.
func waitNewCert(t *testing.T, pl *places, old string) {
	t.Helper()
	testwait.Within(t, 30*time.Second, "a renewal through the CA once only the new root is trusted", func() bool {
		c := pl.workloadCert()
		return c != nil && c.Leaf != nil && c.Leaf.SerialNumber.String() != old
	})
}

// write replaces path's content atomically (temp file and rename), as a
// kubelet or an operator's tool does.
func write(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

// agentToken makes the agent's service account in ns with the RBAC of
// docs/trust.md (get, list and watch on the namespace's ConfigMaps; list and
// watch on ClusterTrustBundles) and returns a token of it.
func agentToken(t *testing.T, env *kubeenv.Env, ns string) string {
	t.Helper()
	ctx := context.Background()
	c := env.Client()
	if _, err := env.CreateServiceAccount(ctx, ns, "meshagent"); err != nil {
		t.Fatal(err)
	}
	subjects := []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "meshagent"}}
	if _, err := c.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "meshagent-trust"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "meshagent-trust"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "meshagent-trust"},
		Subjects:   subjects,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	name := "meshagent-trust-" + ns
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"clustertrustbundles"}, Verbs: []string{"list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   subjects,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := env.Token(ctx, ns, "meshagent", nil, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

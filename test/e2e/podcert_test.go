//go:build e2e

package e2e

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/podcert"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// refreshEnv, set to 1, makes the pod certificates live one hour with the refresh
// asked as early as the API allows (ten minutes after notBefore), and has the
// node-mode test wait for the kubelet's refresh: 10-17 minutes more (12 measured).
const refreshEnv = "MESHAGENT_E2E_POD_CERT_REFRESH"

func waitRefresh() bool { return os.Getenv(refreshEnv) == "1" }

const (
	podCertSigner = "meshagent.io/workload-identity"
	mtlsImage     = "meshagent.test/e2e-mtls:e2e"
	mtlsDir       = "/var/run/mesh"
)

// mtlsReport is one line of the pod-certificate workload's log (test/e2e/images/mtls).
type mtlsReport struct {
	Time      time.Time `json:"time"`
	Self      string    `json:"self"`
	SelfErr   string    `json:"self_err"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	Serial    string    `json:"serial"`
	Files     []struct {
		Name string `json:"name"`
		Mode string `json:"mode"`
		UID  uint32 `json:"uid"`
		GID  uint32 `json:"gid"`
	} `json:"files"`
	Peer     string   `json:"peer"`
	PeerSaw  string   `json:"peer_saw"`
	PeerErr  string   `json:"peer_err"`
	Accepted []string `json:"accepted"`
	Sockets  []string `json:"sockets"`
}

// mtlsPod is a pod with nothing of the mesh but the two projected volumes of
// docs/pod-certificates.md: its certificate and key from the node agent's signer, and
// the roots from the ClusterTrustBundle the chart's trust publisher publishes, by name.
func mtlsPod(name, sa, peer string, fsGroup *int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appsNamespace},
		Spec: corev1.PodSpec{
			ServiceAccountName:            sa,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To[int64](1000),
				FSGroup:        fsGroup,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "mtls",
				Image:           mtlsImage,
				ImagePullPolicy: corev1.PullNever,
				Env:             []corev1.EnvVar{{Name: "DIR", Value: mtlsDir}, {Name: "PEER", Value: peer}, {Name: "INTERVAL", Value: "1s"}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "mesh-identity", MountPath: mtlsDir, ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{
				Name: "mesh-identity",
				VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{PodCertificate: &corev1.PodCertificateProjection{
						SignerName:           podCertSigner,
						KeyType:              "ECDSAP256",
						CredentialBundlePath: "credentialbundle.pem",
						MaxExpirationSeconds: maxExpiration(),
					}},
					{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{
						Name: ptr.To(podcert.BundleName(podCertSigner)),
						Path: "roots.pem",
					}},
				}}},
			}},
		},
	}
}

// graceRatio is the agent's SECRET_GRACE_PERIOD_RATIO: with refreshEnv, renew at once
// (the agent keeps beginRefreshAt ten minutes after notBefore, as the API requires).
func graceRatio() string {
	if waitRefresh() {
		return "0.99"
	}
	return "0.5"
}

func maxExpiration() *int32 {
	if waitRefresh() {
		return ptr.To[int32](3600)
	}
	return nil
}

// mtlsReports reads the workload's lines from its log file on the node.
func mtlsReports(pod *corev1.Pod) []mtlsReport {
	var out []mtlsReport
	for _, line := range strings.Split(containerLog(pod, "mtls"), "\n") {
		// CRI log format: <time> <stream> <P|F> <line>
		parts := strings.SplitN(line, " ", 4)
		var r mtlsReport
		if len(parts) == 4 && json.Unmarshal([]byte(parts[3]), &r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// podCertificates is the scenario of docs/pod-certificates.md on the real node: two
// pods of the Pod Security "restricted" namespace, each with only the two projected
// volumes, one serving mutual TLS and one dialing it at its pod IP.
type podCertificates struct {
	server, client *corev1.Pod
	serverCreated  time.Time
}

// startPodCertificates creates the serving pod, so that the kubelet's request is
// answered while the rest of the node-mode test runs.
func startPodCertificates(t *testing.T) *podCertificates {
	t.Helper()
	ctx := context.Background()
	core := kube.Client().CoreV1()
	for _, sa := range []string{"carol", "dave"} {
		if _, err := core.ServiceAccounts(appsNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pc := &podCertificates{serverCreated: time.Now()}
	// fsGroup: the kubelet then writes the credential bundle 0600 (else the volume's
	// defaultMode, 0644).
	srv, err := core.Pods(appsNamespace).Create(ctx, mtlsPod("mtls-server", "carol", "", ptr.To[int64](1000)), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a pod with podCertificate and clusterTrustBundle volumes in the restricted namespace: %v", err)
	}
	pc.server = srv
	return pc
}

func spiffeID(sa string) string {
	return fmt.Sprintf("spiffe://cluster.local/ns/%s/sa/%s", appsNamespace, sa)
}

// check waits for the serving pod, starts the dialing one at its pod IP, and checks
// the handshake in both directions, the files, and the requests the kubelet made.
func (pc *podCertificates) check(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	core := kube.Client().CoreV1()
	c := kube.Client()

	bundles, err := c.CertificatesV1().ClusterTrustBundles().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bundles.Items {
		t.Logf("ClusterTrustBundle %s: signer %s, labels %v, %d bytes", b.Name, b.Spec.SignerName, b.Labels, len(b.Spec.TrustBundle))
	}

	srv := waitPodRunning(t, appsNamespace, "mtls-server")
	t.Logf("mtls-server Running %.1fs after it was created (waited for since the socket pods were served)", time.Since(pc.serverCreated).Seconds())
	clientCreated := time.Now()
	if _, err := core.Pods(appsNamespace).Create(ctx, mtlsPod("mtls-client", "dave", net.JoinHostPort(srv.Status.PodIP, "8443"), nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cli := waitPodRunning(t, appsNamespace, "mtls-client")
	pc.server, pc.client = srv, cli
	t.Logf("mtls-client Running %.1fs after it was created", time.Since(clientCreated).Seconds())

	// The client's handshake: the server is carol, and the server saw dave.
	done := pc.handshake(t, time.Time{})
	t.Logf("mtls-client: first handshake %.1fs after it was created: self %s, peer %s at %s, the peer saw %s", done.Time.Sub(clientCreated).Seconds(), done.Self, done.Peer, srv.Status.PodIP, done.PeerSaw)
	// The server's side: it accepted dave (and only ever a verified identity).
	var accepted []string
	deadline := time.Now().Add(10 * time.Second)
	for len(accepted) == 0 && time.Now().Before(deadline) {
		for _, r := range mtlsReports(srv) {
			accepted = append(accepted, r.Accepted...)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(accepted) == 0 {
		t.Fatal("mtls-server reports no accepted client")
	}
	for _, id := range accepted {
		if id != spiffeID("dave") {
			t.Fatalf("mtls-server accepted %s, want only %s", id, spiffeID("dave"))
		}
	}

	// Each pod: its own identity, its files, no socket, nothing of the mesh in its spec.
	for _, p := range []struct {
		pod *corev1.Pod
		sa  string
	}{{srv, "carol"}, {cli, "dave"}} {
		r := pc.last(t, p.pod)
		if r.Self != spiffeID(p.sa) {
			t.Fatalf("%s: its certificate is for %q (%s), want %s", p.pod.Name, r.Self, r.SelfErr, spiffeID(p.sa))
		}
		if len(r.Sockets) > 0 {
			t.Fatalf("%s has the agent's socket at %v", p.pod.Name, r.Sockets)
		}
		if len(p.pod.Spec.Containers) != 1 || len(p.pod.Spec.InitContainers) != 0 || len(p.pod.Spec.Volumes) != 1 || p.pod.Spec.Volumes[0].Projected == nil {
			t.Fatalf("%s: containers, init containers or volumes besides the projected volume", p.pod.Name)
		}
		var files []string
		for _, f := range r.Files {
			files = append(files, fmt.Sprintf("%s %s %d:%d", f.Name, f.Mode, f.UID, f.GID))
		}
		t.Logf("%s: %s, valid %s to %s (%s), files: %s", p.pod.Name, r.Self, r.NotBefore.Format(time.RFC3339), r.NotAfter.Format(time.RFC3339), r.NotAfter.Sub(r.NotBefore), strings.Join(files, "; "))
		if n := pc.checkRequest(t, p.pod, r); n != 1 {
			t.Fatalf("%s: %d PodCertificateRequests, want 1", p.pod.Name, n)
		}
	}
}

// checkRequest finds, among the kubelet's PodCertificateRequests for a pod, the one
// whose issued chain is the one in the pod's files (report r), checks it is for the
// pod's identity and the key of the kubelet's stub CSR, and returns how many requests
// the pod has.
func (pc *podCertificates) checkRequest(t *testing.T, pod *corev1.Pod, r mtlsReport) int {
	t.Helper()
	reqs, err := kube.Client().CertificatesV1().PodCertificateRequests(appsNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n, found := 0, false
	for _, req := range reqs.Items {
		if req.Spec.PodUID != pod.UID {
			continue
		}
		n++
		var issued *metav1.Condition
		for i, cond := range req.Status.Conditions {
			if cond.Type == certv1.PodCertificateRequestConditionTypeIssued && cond.Status == metav1.ConditionTrue {
				issued = &req.Status.Conditions[i]
			}
		}
		if issued == nil {
			t.Logf("%s: request %s created %s: %+v", pod.Name, req.Name, req.CreationTimestamp.Format(time.RFC3339), req.Status.Conditions)
			continue
		}
		block, _ := pem.Decode([]byte(req.Status.CertificateChain))
		if block == nil {
			t.Fatalf("%s: request %s has no chain", pod.Name, req.Name)
		}
		leaf, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if leaf.SerialNumber.Text(16) != r.Serial {
			continue
		}
		found = true
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != spiffeID(pod.Spec.ServiceAccountName) {
			t.Fatalf("%s: issued URI SANs %v, want %s", pod.Name, leaf.URIs, spiffeID(pod.Spec.ServiceAccountName))
		}
		csr, err := x509.ParseCertificateRequest(req.Spec.StubPKCS10Request)
		if err != nil {
			t.Fatalf("%s: the kubelet's stub CSR: %v", pod.Name, err)
		}
		if pub, ok := csr.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(leaf.PublicKey) {
			t.Fatalf("%s: the issued certificate is not for the key of the kubelet's stub CSR", pod.Name)
		}
		life := req.Status.NotAfter.Sub(req.Status.NotBefore.Time)
		t.Logf("%s: request %s (node %s, key %s, maxExpirationSeconds %d) created %s, issued %s; notBefore %s, beginRefreshAt %s (after %.0f%% of the life), notAfter %s",
			pod.Name, req.Name, req.Spec.NodeName, csr.PublicKeyAlgorithm, ptr.Deref(req.Spec.MaxExpirationSeconds, 0),
			req.CreationTimestamp.Format(time.RFC3339), issued.LastTransitionTime.Format(time.RFC3339),
			req.Status.NotBefore.Format(time.RFC3339), req.Status.BeginRefreshAt.Format(time.RFC3339),
			100*req.Status.BeginRefreshAt.Sub(req.Status.NotBefore.Time).Seconds()/life.Seconds(),
			req.Status.NotAfter.Format(time.RFC3339))
	}
	if !found {
		t.Fatalf("%s: none of its %d PodCertificateRequests issued the certificate of its files (serial %s)", pod.Name, n, r.Serial)
	}
	return n
}

// handshake waits for a report of mtls-client, after since, of a handshake with
// mtls-server, checks the identities both sides saw and returns it.
func (pc *podCertificates) handshake(t *testing.T, since time.Time) mtlsReport {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last mtlsReport
	for time.Now().Before(deadline) {
		for _, r := range mtlsReports(pc.client) {
			if !r.Time.After(since) {
				continue
			}
			last = r
			if r.Peer == "" {
				continue
			}
			if r.Self != spiffeID("dave") || r.Peer != spiffeID("carol") || r.PeerSaw != spiffeID("dave") {
				t.Fatalf("mtls-client's handshake: %+v; want self and seen %s, peer %s", r, spiffeID("dave"), spiffeID("carol"))
			}
			return r
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("mtls-client completed no handshake with mtls-server since %s; last report %+v", since.Format(time.RFC3339), last)
	return last
}

// last is a pod's latest report.
func (pc *podCertificates) last(t *testing.T, pod *corev1.Pod) mtlsReport {
	t.Helper()
	rs := mtlsReports(pod)
	if len(rs) == 0 {
		t.Fatalf("%s: no report", pod.Name)
	}
	return rs[len(rs)-1]
}

// recheck, after the agent's and the kubelet's restarts: the pods still complete the
// handshake, with the certificates of their current requests.
func (pc *podCertificates) recheck(t *testing.T, what string) {
	t.Helper()
	r := pc.handshake(t, time.Now())
	n := pc.checkRequest(t, pc.client, r)
	ns := pc.checkRequest(t, pc.server, pc.last(t, pc.server))
	t.Logf("after %s: handshake at %s; mtls-client has %d PodCertificateRequests (serial %s), mtls-server %d", what, r.Time.Format(time.RFC3339), n, r.Serial, ns)
}

// refresh waits for the kubelet to replace mtls-client's certificate on its own, at
// the beginRefreshAt the agent set, and for a handshake with the new one.
func (pc *podCertificates) refresh(t *testing.T) {
	t.Helper()
	before := pc.last(t, pc.client)
	start := time.Now()
	deadline := start.Add(25 * time.Minute)
	for {
		r := pc.last(t, pc.client)
		if r.Serial != before.Serial && r.Serial != "" {
			t.Logf("mtls-client's files changed between %s and %s: serial %s -> %s, valid %s to %s",
				before.Time.Format(time.RFC3339), r.Time.Format(time.RFC3339), before.Serial, r.Serial, r.NotBefore.Format(time.RFC3339), r.NotAfter.Format(time.RFC3339))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mtls-client's certificate (serial %s, valid to %s) not refreshed in 25 minutes", before.Serial, before.NotAfter.Format(time.RFC3339))
		}
		before = r
		time.Sleep(2 * time.Second)
	}
	r := pc.handshake(t, time.Now())
	if n := pc.checkRequest(t, pc.client, r); n < 2 {
		t.Fatalf("mtls-client refreshed with %d PodCertificateRequests", n)
	}
	t.Logf("handshake with the refreshed certificate at %s, %.0fs after the wait began", r.Time.Format(time.RFC3339), time.Since(start).Seconds())
}

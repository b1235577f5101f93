//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/meshagent/meshagent/test/e2e/cluster"
	"github.com/meshagent/meshagent/test/istiod"
)

const podAgentNamespace = "e2e-podagent"

// docBlocks returns the fenced blocks of lang in a page of docs/.
func docBlocks(page, lang string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "docs", page))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, block := range strings.Split(string(b), "```"+lang+"\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		out = append(out, block)
	}
	return out, nil
}

// documentedTemplates returns the injection templates docs/istio.md gives,
// by name: istiod injects with them, so the page and what is tested cannot
// differ.
func documentedTemplates() (map[string]string, error) {
	out, err := istiod.DocumentedTemplates("istio.md")
	if err != nil {
		return nil, err
	}
	if out["meshagent-pod"] == "" {
		return nil, fmt.Errorf("docs/istio.md has no sidecarInjectorWebhook.templates.meshagent-pod block")
	}
	return out, nil
}

// documentedTrustedNodeAccounts returns istiod's CA_TRUSTED_NODE_ACCOUNTS as
// docs/istio.md gives it, for istioctl (values.pilot.env) and for the istiod
// chart (--set env.CA_TRUSTED_NODE_ACCOUNTS=...); the two must name the same list.
func documentedTrustedNodeAccounts() ([]string, error) {
	blocks, err := docBlocks("istio.md", "yaml")
	if err != nil {
		return nil, err
	}
	var istioctl string
	for _, block := range blocks {
		var v struct {
			Kind string `json:"kind"`
			Spec struct {
				Values struct {
					Pilot struct {
						Env map[string]string `json:"env"`
					} `json:"pilot"`
				} `json:"values"`
			} `json:"spec"`
		}
		if yaml.Unmarshal([]byte(block), &v) == nil && v.Kind == "IstioOperator" {
			istioctl = v.Spec.Values.Pilot.Env["CA_TRUSTED_NODE_ACCOUNTS"]
		}
	}
	if istioctl == "" {
		return nil, fmt.Errorf("docs/istio.md: no IstioOperator block setting values.pilot.env.CA_TRUSTED_NODE_ACCOUNTS")
	}
	shells, err := docBlocks("istio.md", "sh")
	if err != nil {
		return nil, err
	}
	var helm string
	for _, block := range shells {
		if _, rest, ok := strings.Cut(block, "--set env.CA_TRUSTED_NODE_ACCOUNTS="); ok {
			rest, _, _ = strings.Cut(rest, "\n")
			helm = strings.ReplaceAll(strings.Trim(strings.TrimSpace(rest), "'\""), `\,`, ",")
		}
	}
	if helm != istioctl {
		return nil, fmt.Errorf("docs/istio.md: the helm way sets CA_TRUSTED_NODE_ACCOUNTS to %q, the istioctl way to %q", helm, istioctl)
	}
	return strings.Split(istioctl, ","), nil
}

// injectedPod is a pod of ns for istiod's injector with the given templates:
// the app is the test client, idle; istio-proxy is the real pilot-agent with the
// Envoy stand-in. No DNS runs in the cluster: istiod's name is resolved by
// the pod's /etc/hosts. extra annotations are added.
func injectedPod(ns, name, sa, templates string, extra map[string]string) *corev1.Pod {
	ann := map[string]string{
		"inject.istio.io/templates": templates,
		// No istio-init: the test's image has no iptables, and traffic capture is not
		// what this checks.
		"sidecar.istio.io/interceptionMode": "NONE",
	}
	for k, v := range extra {
		ann[k] = v
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann},
		Spec: corev1.PodSpec{
			ServiceAccountName:            sa,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			HostAliases:                   []corev1.HostAlias{{IP: istiodIP, Hostnames: []string{caServerName}}},
			Containers: []corev1.Container{{
				Name: "app", Image: clientImage, ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{{Name: "SOCKET", Value: "/nonexistent/socket"}, {Name: "INTERVAL", Value: "10s"}},
			}},
		},
	}
}

// meshNamespace creates a namespace istiod's injector serves, with service account sa,
// once istiod published its root there.
func meshNamespace(t *testing.T, ns, sa string) {
	t.Helper()
	ctx := context.Background()
	core := kube.Client().CoreV1()
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{"istio-injection": "enabled"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoots(t, ns)
}

// waitStandIn waits until the Envoy stand-in of pod ns/name prints, after
// since, a certificate for want, and returns that line.
func waitStandIn(t *testing.T, ns, name, want string, since time.Time, within time.Duration) standInLine {
	t.Helper()
	core := kube.Client().CoreV1()
	deadline := time.Now().Add(within)
	var last standInLine
	for {
		p, err := core.Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			for _, l := range standInLines(p) {
				if l.Kind == "sds" && l.Time.After(since) {
					last = l
					if l.SpiffeID == want && l.Serial != "" {
						return l
					}
				}
			}
		}
		if time.Now().After(deadline) {
			log := "(pod not found)"
			if p != nil {
				log = tail(containerLog(p, "istio-proxy"), 4000)
			}
			t.Fatalf("the Envoy stand-in of %s/%s got no certificate for %s within %s; last: %+v\nistio-proxy log:\n%s",
				ns, name, want, within, last, log)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// istiodCSRs is istiod's count of the certificate requests it received
// (citadel_server_csr_count, on its monitoring port).
func istiodCSRs(t *testing.T) int {
	t.Helper()
	code, body := getIn(t, kube.InNetns, "http://"+controlPlane(t).MonitoringAddr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("istiod /metrics: %d", code)
	}
	n := 0.0
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "citadel_server_csr_count") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err == nil {
				n += v
			}
		}
	}
	return int(n)
}

// heldCerts reads an agent's /debug/certs on its loopback status port, from
// inside the pod's network namespace.
func heldCerts(t *testing.T, pod *corev1.Pod, port int) []heldCert {
	t.Helper()
	pid := podPID(t, pod)
	code, body := getIn(t, func(f func() error) error { return cluster.InNetnsOf(pid, f) }, fmt.Sprintf("http://127.0.0.1:%d/debug/certs", port))
	if code != http.StatusOK {
		t.Fatalf("/debug/certs of %s: %d %s", pod.Name, code, body)
	}
	var held []heldCert
	if err := json.Unmarshal([]byte(body), &held); err != nil {
		t.Fatalf("/debug/certs of %s: %v", pod.Name, err)
	}
	return held
}

type heldCert struct {
	Identity string `json:"identity"`
	Serial   string `json:"serial"`
	Pods     int    `json:"pods"`
}

func sameSerial(a, b string) bool {
	return strings.EqualFold(strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0"))
}

// TestPodAgentBesideIstioProxy: the pod agent shape of docs/istio.md. istiod's
// injector, with the documented template, adds meshagent as a native sidecar
// that the kubelet starts before istio-proxy; meshagent asks istiod for the
// pod's certificate with the pod's own token; pilot-agent finds its socket,
// starts no CA client, and hands the socket to Envoy's stand-in, which gets
// the certificate meshagent holds.
func TestPodAgentBesideIstioProxy(t *testing.T) {
	ctx := context.Background()
	core := kube.Client().CoreV1()
	injectionWebhook(t, waitRoots(t, istiod.Namespace))
	meshNamespace(t, podAgentNamespace, "grace")
	t.Cleanup(func() { _ = core.Namespaces().Delete(context.Background(), podAgentNamespace, metav1.DeleteOptions{}) })

	csrs := istiodCSRs(t)
	start := time.Now()
	pod := injectedPod(podAgentNamespace, "with-pod-agent", "grace", "sidecar,meshagent-pod",
		map[string]string{"sidecar.istio.io/nativeSidecar": "false", "sidecar.istio.io/rewriteAppHTTPProbers": "false"})
	created, err := core.Pods(podAgentNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a pod istiod injects with the documented pod-agent template: %v", err)
	}
	// meshagent is a native sidecar (started before every regular container);
	// istio-proxy is a regular container, started once meshagent's startup probe
	// passed.
	agent := findInit(created, "meshagent")
	if agent == nil || agent.RestartPolicy == nil || *agent.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("no native sidecar meshagent in the injected pod: %v", names(created))
	}
	// The documented image is the one make image builds: the chart's appVersion.
	if want := agentImage + ":" + agentTag(t); agent.Image != want {
		t.Fatalf("docs/istio.md's template names image %s; make image builds %s", agent.Image, want)
	}
	var proxy bool
	for _, c := range created.Spec.Containers {
		proxy = proxy || c.Name == "istio-proxy"
	}
	if !proxy {
		t.Fatalf("istio-proxy is not a regular container of the injected pod: %v", names(created))
	}
	for _, v := range created.Spec.Volumes {
		if v.Name == "workload-socket" && v.EmptyDir == nil {
			t.Fatalf("workload-socket is not the emptyDir of Istio's sidecar template: %+v", v)
		}
	}

	want := spiffeIDIn(podAgentNamespace, "grace")
	got := waitStandIn(t, podAgentNamespace, "with-pod-agent", want, time.Time{}, 3*time.Minute)
	t.Logf("pod agent: Envoy's stand-in got %s (serial %s) %.1fs after the pod was created", got.SpiffeID, got.Serial, time.Since(start).Seconds())
	p, err := core.Pods(podAgentNamespace).Get(ctx, "with-pod-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	proxyLog := containerLog(p, "istio-proxy")
	for _, line := range []string{"Existing workload SDS socket found", "Skipping connecting to CA"} {
		if !strings.Contains(proxyLog, line) {
			t.Errorf("pilot-agent did not log %q:\n%s", line, tail(proxyLog, 4000))
		}
	}
	var held bool
	for _, h := range heldCerts(t, p, 15030) {
		if h.Identity == want {
			held = true
			if !sameSerial(h.Serial, got.Serial) {
				t.Fatalf("meshagent holds %s with serial %s; Envoy's stand-in got %s", want, h.Serial, got.Serial)
			}
		}
	}
	if !held {
		t.Fatalf("the pod's meshagent holds no certificate for %s", want)
	}
	// istiod counted the pod's certificate requests: meshagent's, and none of
	// pilot-agent's (which logged that it skips its CA client).
	t.Logf("pod agent: istiod received %d CSR(s) while the pod started; pilot-agent made none", istiodCSRs(t)-csrs)
}

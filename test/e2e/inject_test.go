//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/meshagent/meshagent/test/istiod"
)

const (
	injectNamespace = "e2e-inject"
	// proxyHub and proxyTag name the istio-proxy image the injector asks for
	// (<hub>/proxyv2:<tag>): the real pilot-agent with an Envoy stand-in.
	proxyHub   = "meshagent.test"
	proxyTag   = "e2e"
	proxyImage = proxyHub + "/proxyv2:" + proxyTag
)

// injectionWebhook points the API server at istiod's injector for namespaces
// labelled istio-injection=enabled, as Istio's chart does.
func injectionWebhook(t *testing.T, roots []byte) {
	t.Helper()
	path := "/inject"
	port := int32(istiod.WebhookPort)
	hook := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-sidecar-injector"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "namespace.sidecar-injector.istio.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: istiod.Namespace, Name: "istiod", Path: &path, Port: &port},
				CABundle: roots,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"istio-injection": "enabled"}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
		}},
	}
	if _, err := kube.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(), hook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), hook.Name, metav1.DeleteOptions{})
	})
}

// standInLine is one line of the Envoy stand-in's log (test/e2e/images/envoy).
type standInLine struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"`
	Stream   bool      `json:"stream"`
	SpiffeID string    `json:"spiffe_id"`
	Serial   string    `json:"serial"`
	Roots    int       `json:"roots"`
	Socket   string    `json:"socket"`
	Error    string    `json:"error"`
}

// checkInjection: a pod of a namespace with injection on, asking for the
// templates docs/kubernetes.md gives ("sidecar,meshagent"), gets istiod's
// injected istio-proxy (the real pilot-agent, with a stand-in for Envoy),
// whose pilot-agent finds the node agent's socket on the CSI volume, hands
// it to Envoy and asks istiod for nothing: the stand-in fetches the pod's
// certificate from the node agent (the serial the agent holds for that
// identity).
func checkInjection(t *testing.T, agent *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	core := kube.Client().CoreV1()
	roots := waitRoots(t, istiod.Namespace)
	injectionWebhook(t, roots)
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: injectNamespace, Labels: map[string]string{"istio-injection": "enabled"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.ServiceAccounts(injectNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "frank"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoots(t, injectNamespace)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "injected",
			Annotations: map[string]string{
				"inject.istio.io/templates": "sidecar,meshagent",
				// No istio-init: the test's image has no iptables, and traffic capture is not
				// what this checks.
				"sidecar.istio.io/interceptionMode": "NONE",
			},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName:            "frank",
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "app", Image: clientImage, ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{{Name: "SOCKET", Value: "/nonexistent/socket"}, {Name: "INTERVAL", Value: "10s"}},
			}},
		},
	}
	created, err := core.Pods(injectNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a pod istiod injects with the documented template: %v", err)
	}
	proxy := findInit(created, "istio-proxy")
	if proxy == nil {
		t.Fatalf("istiod injected no istio-proxy init container (native sidecar): %v", names(created))
	}
	var csi bool
	for _, v := range created.Spec.Volumes {
		csi = csi || (v.Name == "workload-socket" && v.CSI != nil && v.CSI.Driver == "csi.meshagent.io")
	}
	if !csi {
		t.Fatalf("the injected pod's workload-socket is not the CSI volume: %+v", created.Spec.Volumes)
	}

	want := spiffeIDIn(injectNamespace, "frank")
	deadline := time.Now().Add(3 * time.Minute)
	var last standInLine
	for {
		p, err := core.Pods(injectNamespace).Get(ctx, "injected", metav1.GetOptions{})
		if err == nil {
			for _, l := range standInLines(p) {
				if l.Kind == "sds" {
					last = l
				}
			}
		}
		if last.SpiffeID == want && last.Serial != "" {
			break
		}
		if time.Now().After(deadline) {
			log := "(pod not found)"
			if p != nil {
				log = tail(containerLog(p, "istio-proxy"), 4000)
			}
			t.Fatalf("the Envoy stand-in of the injected pod got no certificate for %s within 3 minutes; last: %+v\nistio-proxy log:\n%s",
				want, last, log)
		}
		time.Sleep(time.Second)
	}
	p, _ := core.Pods(injectNamespace).Get(ctx, "injected", metav1.GetOptions{})
	proxyLog := containerLog(p, "istio-proxy")
	if !strings.Contains(proxyLog, "Existing workload SDS socket found") {
		t.Errorf("pilot-agent did not say it found the node agent's socket:\n%s", tail(proxyLog, 4000))
	}
	if !strings.Contains(proxyLog, "Skipping connecting to CA") {
		t.Errorf("pilot-agent did not say it skips its CA client:\n%s", tail(proxyLog, 4000))
	}
	// The node agent holds that identity, with the serial the stand-in got.
	certs := debugCerts(t, agent)
	var held []struct {
		Identity string `json:"identity"`
		Serial   string `json:"serial"`
	}
	if err := json.Unmarshal([]byte(certs), &held); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, h := range held {
		if h.Identity == want {
			found = strings.EqualFold(strings.TrimLeft(h.Serial, "0"), strings.TrimLeft(last.Serial, "0"))
			if !found {
				t.Fatalf("the node agent holds %s with serial %s; the stand-in got %s", want, h.Serial, last.Serial)
			}
		}
	}
	if !found {
		t.Fatalf("the node agent holds no certificate for %s:\n%s", want, certs)
	}
	t.Logf("injected pod: pilot-agent found the node agent's socket, Envoy's stand-in got %s (serial %s, %d roots) from meshagent", last.SpiffeID, last.Serial, last.Roots)

	// Gone while the CSI driver still runs, so its volume is unmounted.
	if err := core.Namespaces().Delete(ctx, injectNamespace, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "the injected pod", func() bool {
		l, err := core.Pods(injectNamespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
}

func spiffeIDIn(ns, sa string) string { return "spiffe://cluster.local/ns/" + ns + "/sa/" + sa }

func findInit(p *corev1.Pod, name string) *corev1.Container {
	for i := range p.Spec.InitContainers {
		if p.Spec.InitContainers[i].Name == name {
			return &p.Spec.InitContainers[i]
		}
	}
	return nil
}

func names(p *corev1.Pod) []string {
	var out []string
	for _, c := range p.Spec.InitContainers {
		out = append(out, "init:"+c.Name)
	}
	for _, c := range p.Spec.Containers {
		out = append(out, c.Name)
	}
	return out
}

// standInLines reads the stand-in's JSON lines from istio-proxy's log
// (pilot-agent passes Envoy's output through).
func standInLines(p *corev1.Pod) []standInLine {
	return jsonLines(p, "istio-proxy", func(l standInLine) bool { return l.Kind != "" })
}

// jsonLines decodes the JSON lines of a container's log files on the node
// (each after the runtime's prefix) that keep accepts.
func jsonLines[T any](p *corev1.Pod, container string, keep func(T) bool) []T {
	files, _ := filepath.Glob(filepath.Join("/var/log/pods", p.Namespace+"_"+p.Name+"_"+string(p.UID), container, "*.log"))
	var out []T
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if i := strings.Index(line, "{"); i >= 0 {
				var l T
				if json.Unmarshal([]byte(line[i:]), &l) == nil && keep(l) {
					out = append(out, l)
				}
			}
		}
		fh.Close()
	}
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

package istio

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshagent/meshagent/test/istiod"
)

// containersTemplate is the shape of injection template docs/kubernetes.md gave
// before: it patches istio-proxy under containers. Kept to show why the
// documented template patches only the volume.
const containersTemplate = `spec:
  containers:
    - name: istio-proxy
      volumeMounts:
        - name: workload-socket
          mountPath: /var/run/secrets/workload-spiffe-uds
          readOnly: true
  volumes:
    - name: workload-socket
      csi:
        driver: csi.meshagent.io
        readOnly: true
`

// TestInjectionTemplateOfTheDocs: istiod's own sidecar injector, with
// Istio's templates and the one docs/kubernetes.md gives, injects a pod
// asking for "sidecar,meshagent": istio-proxy keeps its mount of the
// workload socket directory, which is now the CSI volume of the node agent,
// and the API server accepts the pod, with native sidecars and without.
// The template that patched istio-proxy under containers is refused with
// native sidecars, as it was on a real cluster.
func TestInjectionTemplateOfTheDocs(t *testing.T) {
	ca := control(t)
	w := newWorkload(t, "web", "node-a")
	for _, tc := range []struct {
		template string
		native   string
		accepted bool
	}{
		{"meshagent", "true", true},
		{"meshagent", "false", true},
		{"meshagent-containers", "true", false},
	} {
		t.Run(tc.template+"/native="+tc.native, func(t *testing.T) {
			pod := &corev1.Pod{
				TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
				ObjectMeta: metav1.ObjectMeta{
					Name: "app-" + strings.ReplaceAll(tc.template, "-", "") + "-" + tc.native, Namespace: w.ns,
					Labels: map[string]string{"app": "app", "sidecar.istio.io/inject": "true"},
					Annotations: map[string]string{
						"inject.istio.io/templates":      "sidecar," + tc.template,
						"sidecar.istio.io/nativeSidecar": tc.native,
					},
				},
				Spec: corev1.PodSpec{
					ServiceAccountName: w.sa,
					Containers:         []corev1.Container{{Name: "app", Image: "meshagent.test/app:e2e"}},
				},
			}
			injected := inject(t, ca, pod)
			_, err := w.env.Client().CoreV1().Pods(w.ns).Create(context.Background(), injected,
				metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if !tc.accepted {
				if err == nil {
					t.Fatalf("the API server accepted the pod the %s template made", tc.template)
				}
				t.Logf("refused, as expected: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("the API server refuses the injected pod: %v", err)
			}
			proxy, native := findContainer(injected, "istio-proxy")
			if proxy == nil {
				t.Fatal("no istio-proxy injected")
			}
			if want := tc.native == "true"; native != want {
				t.Errorf("istio-proxy is an init container: %v, want %v", native, want)
			}
			var mounted bool
			for _, m := range proxy.VolumeMounts {
				if m.MountPath == "/var/run/secrets/workload-spiffe-uds" {
					mounted = m.Name == "workload-socket"
				}
			}
			if !mounted {
				t.Errorf("istio-proxy does not mount workload-socket at /var/run/secrets/workload-spiffe-uds: %+v", proxy.VolumeMounts)
			}
			for _, v := range injected.Spec.Volumes {
				if v.Name != "workload-socket" {
					continue
				}
				if v.CSI == nil || v.CSI.Driver != "csi.meshagent.io" || v.EmptyDir != nil {
					t.Fatalf("volume workload-socket is %+v, want the CSI volume of csi.meshagent.io alone", v.VolumeSource)
				}
				return
			}
			t.Fatal("no volume workload-socket")
		})
	}
}

// TestPodAgentTemplateOfTheDocs: istiod's injector with the pod agent's
// template of docs/istio.md ("sidecar,meshagent-pod") makes a pod the API
// server accepts. With nativeSidecar "false", as the page says, meshagent is
// a native sidecar and istio-proxy a regular container, so the kubelet starts
// meshagent first; with native sidecars istiod puts istio-proxy first among
// the init containers, which is why the page asks for "false".
func TestPodAgentTemplateOfTheDocs(t *testing.T) {
	ca := control(t)
	w := newWorkload(t, "pod-agent", "node-a")
	for _, native := range []string{"false", "true"} {
		t.Run("native="+native, func(t *testing.T) {
			pod := &corev1.Pod{
				TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
				ObjectMeta: metav1.ObjectMeta{
					Name: "pod-agent-" + native, Namespace: w.ns,
					Labels: map[string]string{"app": "app", "sidecar.istio.io/inject": "true"},
					Annotations: map[string]string{
						"inject.istio.io/templates":      "sidecar,meshagent-pod",
						"sidecar.istio.io/nativeSidecar": native,
					},
				},
				Spec: corev1.PodSpec{
					ServiceAccountName: w.sa,
					Containers:         []corev1.Container{{Name: "app", Image: "meshagent.test/app:e2e"}},
				},
			}
			injected := inject(t, ca, pod)
			if _, err := w.env.Client().CoreV1().Pods(w.ns).Create(context.Background(), injected,
				metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
				t.Fatalf("the API server refuses the injected pod: %v", err)
			}
			agent, agentInit := findContainer(injected, "meshagent")
			proxy, proxyInit := findContainer(injected, "istio-proxy")
			if agent == nil || !agentInit || agent.RestartPolicy == nil || *agent.RestartPolicy != corev1.ContainerRestartPolicyAlways {
				t.Fatalf("meshagent is not a native sidecar of the injected pod: %+v", agent)
			}
			if proxy == nil {
				t.Fatal("no istio-proxy injected")
			}
			var env []string
			for _, e := range agent.Env {
				if e.Name == "CA_ADDR" {
					env = append(env, e.Value)
				}
			}
			if len(env) != 1 || env[0] != istiod.ServerName+":15012" {
				t.Errorf("meshagent's CA_ADDR %v, want the mesh's discovery address %s:15012", env, istiod.ServerName)
			}
			var names []string
			for _, c := range injected.Spec.InitContainers {
				names = append(names, c.Name)
			}
			if native == "false" {
				if proxyInit {
					t.Fatalf("istio-proxy is an init container with nativeSidecar false: %v", names)
				}
				t.Logf("init containers %v; istio-proxy a regular container, started after them", names)
				return
			}
			if !proxyInit || slices.Index(names, "istio-proxy") > slices.Index(names, "meshagent") {
				t.Fatalf("with native sidecars, init containers %v: want istio-proxy before meshagent (istiod's order)", names)
			}
			t.Logf("with native sidecars istiod orders %v: istio-proxy would start before meshagent", names)
		})
	}
}

// findContainer returns the pod's container name and whether it is an init
// container.
func findContainer(pod *corev1.Pod, name string) (*corev1.Container, bool) {
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i], true
		}
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i], false
		}
	}
	return nil, false
}

// inject sends pod to istiod's injector as the API server's admission
// webhook would and returns the pod its JSON patch makes.
func inject(t *testing.T, ca *istiod.Istiod, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("review-" + pod.Name),
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: pod.Namespace,
			Name:      pod.Name,
			Operation: admissionv1.Create,
			Object:    runtimeRaw(raw),
		},
	}
	body, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := ca.Roots(context.Background(), istiod.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(roots)
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: istiod.ServerName},
		DisableKeepAlives: true,
	}}
	resp, err := client.Post("https://"+ca.WebhookAddr+"/inject", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("istiod's injector: %v", err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("istiod's injector: %s %s", resp.Status, out)
	}
	var answer admissionv1.AdmissionReview
	if err := json.Unmarshal(out, &answer); err != nil {
		t.Fatal(err)
	}
	if answer.Response == nil || !answer.Response.Allowed {
		t.Fatalf("istiod's injector refused the pod: %s", out)
	}
	if len(answer.Response.Patch) == 0 {
		t.Fatalf("istiod's injector did not change the pod: %s", out)
	}
	patch, err := jsonpatch.DecodePatch(answer.Response.Patch)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("applying the injector's patch: %v", err)
	}
	var injected corev1.Pod
	if err := json.Unmarshal(patched, &injected); err != nil {
		t.Fatal(err)
	}
	return &injected
}

func runtimeRaw(b []byte) runtime.RawExtension { return runtime.RawExtension{Raw: b} }

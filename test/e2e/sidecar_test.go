//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The sidecar shape with no Envoy and no control plane: the agent beside a plain
// go-spiffe/SDS client, identity from TokenRequest, Ready once it holds a certificate.
// Then `helm upgrade` to node mode (the same namespace's pods now mount the CSI volume)
// and `helm uninstall`, which must leave nothing behind.
const (
	sidecarNamespace = "e2e-sidecar"
	sidecarRelease   = "mesh"
)

func TestSidecarThenUpgradeToNodeModeThenUninstall(t *testing.T) {
	const (
		ns  = sidecarNamespace
		rel = sidecarRelease
		sa  = "mesh-meshagent-workload" // <fullname>-workload
	)
	ctx := context.Background()
	core := kube.Client().CoreV1()
	controlPlane(t)
	// The sidecar pods would pass Pod Security "restricted"; the node agent the upgrade
	// brings cannot (hostPID, hostPath, the privileged CSI container), so the namespace
	// must allow privileged pods, as any node agent's namespace must.
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// istiod publishes its root in every namespace: the chart mounts that ConfigMap.
	waitRoots(t, ns)
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`image:
  pullPolicy: Never
caAddress: "`+istiodAddr+`"
istiodSAN: `+caServerName+`
credentialFetcherType: TokenRequest
sidecar:
  xdsProxy: false
  envoy:
    enabled: false
  containers:
    - name: client
      image: `+clientImage+`
      imagePullPolicy: Never
      env:
        - {name: SOCKET, value: /var/run/secrets/workload-spiffe-uds/socket}
        - {name: INTERVAL, value: 1s}
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
      volumeMounts:
        - {name: workload-socket, mountPath: /var/run/secrets/workload-spiffe-uds, readOnly: true}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(repoRoot(), "deploy", "helm", "meshagent")
	start := time.Now()
	// --wait: Ready means the agent holds a certificate; there is no control plane.
	run(t, "helm", "install", rel, chart, "--namespace", ns, "--values", values, "--wait", "--timeout", "3m")
	t.Logf("sidecar Deployment Ready %.1fs after helm install, without Envoy or a control plane", time.Since(start).Seconds())
	pods, err := core.Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=workload"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("sidecar pods: %v, %v", pods, err)
	}
	r := waitServed(t, &pods.Items[0], sa, time.Time{})
	t.Logf("sidecar client: Workload API %s, SDS %s", r.WorkloadAPI, r.SDS)

	// Upgrade to node mode: the Deployment goes, the DaemonSet and CSI driver come.
	run(t, "helm", "upgrade", rel, chart, "--namespace", ns, "--reuse-values",
		"--set", "sidecar.enabled=false,node.enabled=true,credentialFetcherType=JWT", "--wait", "--timeout", "3m")
	waitGone(t, "the sidecar pods", func() bool {
		l, err := core.Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=workload"})
		return err == nil && len(l.Items) == 0
	})
	if _, err := core.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "carol"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := clientPod("client-c", "carol")
	p.Namespace = ns
	if _, err := core.Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = waitPodRunning(t, ns, "client-c")
	r = waitServed(t, p, "carol", time.Time{})
	t.Logf("after the upgrade to node mode: Workload API %s, SDS %s", r.WorkloadAPI, r.SDS)

	if err := core.Pods(ns).Delete(ctx, "client-c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "client-c", func() bool {
		_, err := core.Pods(ns).Get(ctx, "client-c", metav1.GetOptions{})
		return err != nil && csiMounts(t, p) == 0
	})
	run(t, "helm", "uninstall", rel, "--namespace", ns, "--wait", "--timeout", "2m")
	checkNothingLeft(t, ns, rel)
}

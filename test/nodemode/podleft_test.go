package nodemode

import (
	"context"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/test/podproc"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// TestNodePodLeft: a pod that leaves (deleted, Succeeded, Failed) loses its
// connections to the agent: its open stream ends with PermissionDenied
// naming why, and it is not served again, while a pod that stays is.
func TestNodePodLeft(t *testing.T) {
	ns := namespace(t, "left")
	n := startNode(t, uniq("node"))
	sock := n.agent.Socket()
	stay := pod(t, ns, "stay-0", "stay", n.name)
	stayer := startCaller(t, sock, callerOpts{podUID: string(stay.UID), shape: podproc.Cgroupfs})
	if got := stayer.do("stream"); got != "ok "+spiffe(ns, "stay") {
		t.Fatalf("stay-0 stream: %q", got)
	}

	for _, tc := range []struct {
		name  string
		leave func(p *corev1.Pod)
		why   string
	}{
		{"deleted", func(p *corev1.Pod) {
			zero := int64(0)
			if err := kube.Env(t).Client().CoreV1().Pods(ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatal(err)
			}
		}, "was deleted"},
		{"succeeded", func(p *corev1.Pod) { setPhase(t, ns, p, corev1.PodSucceeded) }, "has finished (Succeeded)"},
		{"failed", func(p *corev1.Pod) { setPhase(t, ns, p, corev1.PodFailed) }, "has finished (Failed)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sa := "leaves-" + tc.name
			p := pod(t, ns, sa+"-0", sa, n.name)
			c := startCaller(t, sock, callerOpts{podUID: string(p.UID), shape: podproc.Cgroupfs})
			if got := c.do("stream"); got != "ok "+spiffe(ns, sa) {
				t.Fatalf("stream before leaving: %q", got)
			}
			tc.leave(p)
			got := c.do("next")
			if !strings.HasPrefix(got, "error PermissionDenied") || !strings.Contains(got, tc.why) || !strings.Contains(got, p.Name) {
				t.Fatalf("open stream after the pod left: %q, want PermissionDenied naming the pod and %q", got, tc.why)
			}
			if got := c.fetch(); !strings.HasPrefix(got, "error PermissionDenied") {
				t.Fatalf("a new call after the pod left: %q, want it refused", got)
			}
		})
	}
	// The pod that stays is not disturbed.
	if got := stayer.fetch(); got != "ok "+spiffe(ns, "stay") {
		t.Fatalf("stay-0 after the others left: %q", got)
	}
}

func setPhase(t *testing.T, ns string, p *corev1.Pod, phase corev1.PodPhase) {
	t.Helper()
	ctx := context.Background()
	cur, err := kube.Env(t).Client().CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.Phase = phase
	if _, err := kube.Env(t).Client().CoreV1().Pods(ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// describeDiscovery is describe of a raw SDS response for "default".
func describeDiscovery(t *testing.T, resp *discoveryv3.DiscoveryResponse) string {
	t.Helper()
	r, err := sdsclient.Decode(resp)
	if err != nil {
		t.Fatal(err)
	}
	return describe(r, []string{"default"})
}

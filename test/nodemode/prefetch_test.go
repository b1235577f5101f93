package nodemode

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/meshagent/meshagent/internal/csi"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/podproc"
)

// csiPod creates a pod of sa on nodeName that mounts the node agent's
// socket as docs/kubernetes.md says: an inline volume of its CSI driver.
func csiPod(t *testing.T, ns, name, sa, nodeName string) *corev1.Pod {
	t.Helper()
	kube := kube.Env(t)
	ctx := context.Background()
	if _, err := kube.Client().CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{}); err != nil {
		if _, err := kube.CreateServiceAccount(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			NodeName:           nodeName,
			Containers: []corev1.Container{{Name: "app", Image: kubeenv.PodImage,
				VolumeMounts: []corev1.VolumeMount{{Name: "workload-socket", MountPath: "/run/meshagent", ReadOnly: true}}}},
			Volumes: []corev1.Volume{{Name: "workload-socket", VolumeSource: corev1.VolumeSource{
				CSI: &corev1.CSIVolumeSource{Driver: csi.DriverName, ReadOnly: ptr.To(true)}}}},
		},
	}
	p, err := kube.Client().CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A pod that mounts the agent's CSI volume has its identity's certificate
// fetched ahead with no annotation, as does an identity whose first pod did
// not ask once a pod of it that mounts the volume arrives; a pod without the
// volume costs no CSR before its first request. A pod fetched ahead that
// never asks releases its identity when it is deleted, as any other.
func TestPrefetchForPodsOfTheCSIVolume(t *testing.T) {
	ns := namespace(t, "csipf")
	name := uniq("node")
	mounts := csiPod(t, ns, "mounts-0", "mounts", name)
	quiet := pod(t, ns, "quiet-0", "quiet", name)
	pod(t, ns, "late-0", "late", name)
	n := startNode(t, name)
	mountsID, quietID, lateID := spiffe(ns, "mounts"), spiffe(ns, "quiet"), spiffe(ns, "late")
	csrs := func(id string) int {
		k := 0
		for _, r := range n.ca.CSRs() {
			if r.Identity == id {
				k++
			}
		}
		return k
	}
	testwait.Within(t, 30*time.Second, "the certificate of the pod that mounts the CSI volume is fetched ahead", func() bool {
		_, held := n.certs()[mountsID]
		return held
	})
	if k := csrs(lateID); k != 0 {
		t.Fatalf("%d CSRs for late-0's identity: its pod has no CSI volume", k)
	}
	csiPod(t, ns, "late-1", "late", name)
	testwait.Within(t, 30*time.Second, "late's certificate is fetched ahead once a pod of it mounts the CSI volume", func() bool {
		_, held := n.certs()[lateID]
		return held
	})
	if k := csrs(quietID); k != 0 {
		t.Fatalf("%d CSRs for a pod without the CSI volume, before its first request", k)
	}
	if got := startCaller(t, n.agent.Socket(), callerOpts{podUID: string(quiet.UID), shape: podproc.Cgroupfs}).fetch(); got != "ok "+quietID {
		t.Fatalf("quiet-0: %q, want %s", got, quietID)
	}
	if k := csrs(mountsID); k != 1 {
		t.Fatalf("%d CSRs for mounts-0's identity, want the 1 fetched ahead", k)
	}
	// mounts-0 never asked: deleted, its identity is released.
	if err := kube.Env(t).Client().CoreV1().Pods(ns).Delete(context.Background(), mounts.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, 30*time.Second, "the identity of the deleted pod that never asked is dropped", func() bool {
		_, held := n.certs()[mountsID]
		return !held
	})
	if _, held := n.certs()[lateID]; !held {
		t.Fatal("late's certificate was dropped while its pods are on the node")
	}
}

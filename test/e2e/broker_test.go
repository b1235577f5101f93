//go:build e2e

package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const (
	brokerImage     = "meshagent.test/e2e-broker:e2e"
	brokerNamespace = "e2e-broker"
	brokerHostDir   = "/var/run/meshagent-broker" // the chart's node.broker.socketDir
	brokerMount     = "/run/spiffe-broker"
)

// brokerReport is one line of the broker image's log (test/e2e/images/broker).
type brokerReport struct {
	Time        time.Time `json:"time"`
	Mode        string    `json:"mode"`
	Self        string    `json:"self"`
	SelfErr     string    `json:"self_err"`
	Workload    string    `json:"workload"`
	WorkloadErr string    `json:"workload_err"`
	Peer        string    `json:"peer"`
	PeerErr     string    `json:"peer_err"`
	Accepted    []string  `json:"accepted"`
}

// brokerPod runs the broker image in mode, with the node agent's socket
// through the CSI volume (its own SVID) and, for the broker, the Broker API
// socket's host directory.
func brokerPod(name, sa, mode string, env ...corev1.EnvVar) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: brokerNamespace, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			ServiceAccountName:            sa,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name:            "broker",
				Image:           brokerImage,
				ImagePullPolicy: corev1.PullNever,
				Env: append([]corev1.EnvVar{
					{Name: "MODE", Value: mode},
					{Name: "INTERVAL", Value: "1s"},
					{Name: "SPIFFE_ENDPOINT_SOCKET", Value: "unix://" + socketMount + "/socket"},
				}, env...),
				VolumeMounts: []corev1.VolumeMount{{Name: "workload-socket", MountPath: socketMount, ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{
				Name: "workload-socket",
				VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
					Driver: "csi.meshagent.io", ReadOnly: ptr.To(true),
				}},
			}},
		},
	}
	if mode == "broker" {
		p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: "spiffe-broker", MountPath: brokerMount, ReadOnly: true})
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "spiffe-broker",
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: brokerHostDir, Type: ptr.To(corev1.HostPathDirectory)}}})
	}
	return p
}

// TestBrokerAPIOnARealNode: the node agent installed by the chart with
// node.broker on; a broker pod (its own SVID from the Workload API through
// the CSI volume) gets a workload pod's SVID over the Broker API, by the
// workload's name, and a peer pod that knows nothing of brokers accepts
// that SVID in a mutual TLS handshake as the workload's identity.
func TestBrokerAPIOnARealNode(t *testing.T) {
	ctx := context.Background()
	controlPlane(t)
	core := kube.Client().CoreV1()
	tar, err := buildImage(repoRoot(), t.TempDir(), "./test/e2e/images/broker", brokerImage, "/usr/local/bin/broker")
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.ImportImage(tar); err != nil {
		t.Fatal(err)
	}
	// The namespaces this test makes go with it, so that the tests after it
	// find the cluster as they would without it.
	var made []string
	for _, ns := range []string{agentNamespace, brokerNamespace} {
		if _, err := core.Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			made = append(made, ns)
		}
	}
	t.Cleanup(func() {
		for _, ns := range made {
			_ = core.Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		}
		for _, ns := range made {
			waitGone(t, "namespace "+ns, func() bool {
				_, err := core.Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			})
		}
	})
	waitRoots(t, agentNamespace)
	brokerID := spiffeIDIn(brokerNamespace, "ztunnel")
	run(t, "helm", "install", release, filepath.Join(repoRoot(), "deploy", "helm", "meshagent"),
		"--namespace", agentNamespace,
		"--set", "sidecar.enabled=false,node.enabled=true,image.pullPolicy=Never",
		"--set", "caAddress="+istiodAddr,
		"--set", "istiodSAN="+caServerName,
		"--set", "node.broker.enabled=true",
		"--set-string", "node.broker.brokers="+brokerID+"=pod",
		"--wait", "--timeout", "3m")
	t.Cleanup(func() {
		run(t, "helm", "uninstall", release, "--namespace", agentNamespace, "--wait", "--timeout", "3m")
		waitGone(t, "the node agent's pods", func() bool {
			pods, err := core.Pods(agentNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node"})
			return err == nil && len(pods.Items) == 0
		})
	})
	// Cleanups run last first: the test's pods go while the node agent and its
	// CSI driver still run, so their volumes are unpublished and the namespace
	// can go (with the driver gone first, they stay Terminating).
	t.Cleanup(func() {
		zero := int64(0)
		_ = core.Pods(brokerNamespace).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		waitGone(t, "the broker test's pods", func() bool {
			pods, err := core.Pods(brokerNamespace).List(context.Background(), metav1.ListOptions{})
			return err == nil && len(pods.Items) == 0
		})
	})
	agent := agentPod(t, "")
	agentID := spiffeIDIn(agentNamespace, agent.Spec.ServiceAccountName)

	for _, sa := range []string{"ztunnel", "web", "peer"} {
		if _, err := core.ServiceAccounts(brokerNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The workload: any pod of the node with the CSI volume (it never asks
	// for its certificate itself here).
	web := clientPod("web-0", "web")
	web.Namespace = brokerNamespace
	peer := brokerPod("peer-0", "peer", "peer", corev1.EnvVar{Name: "LISTEN", Value: ":8443"})
	for _, p := range []*corev1.Pod{web, peer} {
		if _, err := core.Pods(brokerNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	web = waitPodRunning(t, brokerNamespace, "web-0")
	peer = waitPodRunning(t, brokerNamespace, "peer-0")
	broker := brokerPod("ztunnel-0", "ztunnel", "broker",
		corev1.EnvVar{Name: "SPIFFE_BROKER_SOCKET", Value: "unix://" + brokerMount + "/socket"},
		corev1.EnvVar{Name: "AGENT_ID", Value: agentID},
		corev1.EnvVar{Name: "TARGET", Value: brokerNamespace + "/web-0"},
		corev1.EnvVar{Name: "PEER", Value: peer.Status.PodIP + ":8443"})
	if _, err := core.Pods(brokerNamespace).Create(ctx, broker, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	broker = waitPodRunning(t, brokerNamespace, "ztunnel-0")

	webID, peerID := spiffeIDIn(brokerNamespace, "web"), spiffeIDIn(brokerNamespace, "peer")
	deadline := time.Now().Add(2 * time.Minute)
	var last brokerReport
	for {
		lines := jsonLines(broker, "broker", func(r brokerReport) bool { return r.Mode == "broker" })
		if len(lines) > 0 {
			last = lines[len(lines)-1]
		}
		if last.Self == brokerID && last.Workload == webID && last.Peer == peerID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker: %+v; want its own SVID %s, the workload's %s, and a handshake with %s", last, brokerID, webID, peerID)
		}
		time.Sleep(time.Second)
	}
	accepted := false
	for _, r := range jsonLines(peer, "broker", func(r brokerReport) bool { return r.Mode == "peer" }) {
		for _, id := range r.Accepted {
			if id == webID {
				accepted = true
			}
			if id == brokerID {
				t.Errorf("the peer saw the broker's own identity %s, want only the workload's", id)
			}
		}
	}
	if !accepted {
		t.Fatalf("the peer never accepted %s", webID)
	}
	t.Logf("broker %s holds %s's SVID (%s); peer %s accepted it", broker.Name, web.Name, webID, peer.Name)

	// Another broker identity, not listed, is refused.
	stranger := brokerPod("stranger-0", "peer", "broker",
		corev1.EnvVar{Name: "SPIFFE_BROKER_SOCKET", Value: "unix://" + brokerMount + "/socket"},
		corev1.EnvVar{Name: "AGENT_ID", Value: agentID},
		corev1.EnvVar{Name: "TARGET", Value: brokerNamespace + "/web-0"},
		corev1.EnvVar{Name: "PEER", Value: peer.Status.PodIP + ":8443"})
	if _, err := core.Pods(brokerNamespace).Create(ctx, stranger, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stranger = waitPodRunning(t, brokerNamespace, "stranger-0")
	deadline = time.Now().Add(time.Minute)
	for {
		lines := jsonLines(stranger, "broker", func(r brokerReport) bool { return r.Mode == "broker" })
		if n := len(lines); n > 0 && strings.Contains(lines[n-1].WorkloadErr, "PermissionDenied") {
			if lines[n-1].Workload != "" {
				t.Fatalf("an unlisted broker got %s", lines[n-1].Workload)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an unlisted broker was not refused: %v", lines)
		}
		time.Sleep(time.Second)
	}
}

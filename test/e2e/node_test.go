//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
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

	"github.com/meshagent/meshagent/internal/node/podcgroup"
	"github.com/meshagent/meshagent/test/e2e/cluster"
)

const (
	agentNamespace = "meshagent-system"
	release        = "meshagent-node" // the name docs/kubernetes.md uses
	appsNamespace  = "e2e-apps"
	caServerName   = "istiod.istio-system.svc"
	socketMount    = "/run/meshagent"
)

// report is one line of the test client's log (test/e2e/images/client).
type report struct {
	Time           time.Time `json:"time"`
	WorkloadAPI    string    `json:"workload_api"`
	WorkloadAPIErr string    `json:"workload_api_err"`
	SDS            string    `json:"sds"`
	SDSErr         string    `json:"sds_err"`
	RemoveErr      string    `json:"remove_err"`
}

func run(t *testing.T, tool string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := kube.Command(ctx, tool, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func clientPod(name, sa string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appsNamespace},
		Spec: corev1.PodSpec{
			ServiceAccountName:            sa,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To[int64](1000),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "client",
				Image:           clientImage,
				ImagePullPolicy: corev1.PullNever,
				Env:             []corev1.EnvVar{{Name: "SOCKET", Value: socketMount + "/socket"}, {Name: "INTERVAL", Value: "1s"}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "workload-socket", MountPath: socketMount, ReadOnly: true}},
			}},
			// The snippet of docs/kubernetes.md.
			Volumes: []corev1.Volume{{
				Name: "workload-socket",
				VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
					Driver: "csi.meshagent.io", ReadOnly: ptr.To(true),
				}},
			}},
		},
	}
}

// containerLog reads a container's log files on the node (the API server cannot
// proxy logs here: the kubelet accepts no client certificate from it).
func containerLog(pod *corev1.Pod, container string) string {
	files, _ := filepath.Glob(filepath.Join("/var/log/pods", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), container, "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		b.Write(data)
	}
	return b.String()
}

// reports reads the client's lines from the pod's log file on the node.
func reports(t *testing.T, pod *corev1.Pod) []report {
	t.Helper()
	dir := filepath.Join("/var/log/pods", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), "client")
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var out []report
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			// CRI log format: <time> <stream> <P|F> <line>
			parts := strings.SplitN(sc.Text(), " ", 4)
			if len(parts) != 4 {
				continue
			}
			var r report
			if json.Unmarshal([]byte(parts[3]), &r) == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// waitServed waits until the client reports, after since, its own identity over both
// APIs and a socket it could not remove because the volume is read-only.
func waitServed(t *testing.T, pod *corev1.Pod, sa string, since time.Time) report {
	t.Helper()
	want := fmt.Sprintf("spiffe://cluster.local/ns/%s/sa/%s", pod.Namespace, sa)
	deadline := time.Now().Add(90 * time.Second)
	var last report
	for time.Now().Before(deadline) {
		for _, r := range reports(t, pod) {
			if !r.Time.After(since) {
				continue
			}
			last = r
			if r.WorkloadAPI != "" && r.WorkloadAPI != want || r.SDS != "" && r.SDS != want {
				t.Fatalf("pod %s (service account %s) was served another identity: %+v", pod.Name, sa, r)
			}
			if r.WorkloadAPI == want && r.SDS == want {
				if !strings.Contains(r.RemoveErr, "read-only file system") {
					t.Fatalf("pod %s removing the socket: %q, want a read-only file system error", pod.Name, r.RemoveErr)
				}
				return r
			}
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("pod %s not served %s since %s; last report %+v", pod.Name, want, since.Format(time.RFC3339), last)
	return last
}

// csiMounts counts the mounts of the node's mount table under a pod's CSI volumes.
func csiMounts(t *testing.T, pod *corev1.Pod) int {
	t.Helper()
	prefix := filepath.Join(cluster.KubeletDir, "pods", string(pod.UID), "volumes", "kubernetes.io~csi") + "/"
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], prefix) {
			n++
		}
	}
	return n
}

func waitPodRunning(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	var p *corev1.Pod
	for time.Now().Before(deadline) {
		var err error
		p, err = kube.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			return p
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("pod %s/%s not running: %+v", ns, name, p.Status)
	return nil
}

// agentPod returns the node agent's pod once it is Ready.
func agentPod(t *testing.T, not string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		pods, err := kube.Client().CoreV1().Pods(agentNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node"})
		if err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.Name == not || p.DeletionTimestamp != nil {
					continue
				}
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
						return p
					}
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatal("the node agent's pod did not become Ready")
	return nil
}

// debugCerts reads the node agent's /debug/certs as its loopback-only
// handler allows: from 127.0.0.1 in the agent pod's network namespace,
// entered from one of the pod's processes as nsenter --net would.
func debugCerts(t *testing.T, agent *corev1.Pod) string {
	t.Helper()
	pid := podPID(t, agent)
	code, body := getIn(t, func(f func() error) error { return cluster.InNetnsOf(pid, f) }, "http://127.0.0.1:15020/debug/certs")
	if code != http.StatusOK {
		t.Fatalf("/debug/certs from the agent's loopback: %d %s", code, body)
	}
	return body
}

// checkDebugCertsLoopbackOnly checks that /debug/certs refuses a caller
// from the cluster's network (another pod or node process reaching the
// agent's pod IP).
func checkDebugCertsLoopbackOnly(t *testing.T, agent *corev1.Pod) {
	t.Helper()
	code, body := getIn(t, kube.InNetns, "http://"+net.JoinHostPort(agent.Status.PodIP, "15020")+"/debug/certs")
	if code != http.StatusForbidden {
		t.Fatalf("/debug/certs from the cluster's network: %d, want 403 (loopback callers only)\n%s", code, body)
	}
}

// getIn GETs url over connections dialed inside the network namespace that
// inNetns switches to.
func getIn(t *testing.T, inNetns func(func() error) error, url string) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNetns(func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// podPID returns the host pid of one of a pod's processes, found in the
// cgroups the kubelet made for the pod (under kubepods/ for a Guaranteed
// pod, kubepods/<qos class>/ otherwise).
func podPID(t *testing.T, pod *corev1.Pod) int {
	t.Helper()
	base := filepath.Join("/sys/fs/cgroup/pids", cluster.CgroupRoot, "kubepods")
	for _, pattern := range []string{
		filepath.Join(base, "pod"+string(pod.UID), "*", "cgroup.procs"),
		filepath.Join(base, "*", "pod"+string(pod.UID), "*", "cgroup.procs"),
	} {
		dirs, _ := filepath.Glob(pattern)
		for _, procs := range dirs {
			b, err := os.ReadFile(procs)
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					return pid
				}
			}
		}
	}
	t.Fatalf("no process found in the cgroups of pod %s under %s", pod.Name, base)
	return 0
}

func TestNodeModeWithTheCSIDriver(t *testing.T) {
	ctx := context.Background()
	controlPlane(t)
	core := kube.Client().CoreV1()

	// The node agent, installed as docs/kubernetes.md says, with the image of make image.
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// istiod publishes its root in every namespace: the chart mounts that ConfigMap.
	waitRoots(t, agentNamespace)
	installStart := time.Now()
	run(t, "helm", "install", release, filepath.Join(repoRoot(), "deploy", "helm", "meshagent"),
		"--namespace", agentNamespace,
		"--set", "sidecar.enabled=false,node.enabled=true,image.pullPolicy=Never",
		"--set", "node.podCertificateSigner="+podCertSigner,
		"--set", "caAddress="+istiodAddr,
		"--set", "istiodSAN="+caServerName,
		// A deleted pod's identity is dropped after this grace.
		"--set", "extraEnv[0].name=MESHAGENT_IDENTITY_IDLE_GRACE,extraEnv[0].value=3s",
		"--set", "extraEnv[1].name=SECRET_GRACE_PERIOD_RATIO,extraEnv[1].value="+graceRatio(),
		"--wait", "--timeout", "3m")
	agent := agentPod(t, "")
	t.Logf("node agent %s Ready %.1fs after helm install", agent.Name, time.Since(installStart).Seconds())

	// Two workloads of two service accounts in a namespace held to Pod Security
	// "restricted": the CSI volume is allowed there, a hostPath would not be.
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   appsNamespace,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"alice", "bob"} {
		if _, err := core.ServiceAccounts(appsNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	hostPath := clientPod("with-hostpath", "alice")
	hostPath.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/meshagent"}}
	if _, err := core.Pods(appsNamespace).Create(ctx, hostPath, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "restricted") {
		t.Fatalf("a hostPath pod in the restricted namespace: %v, want refused by Pod Security", err)
	}
	// The pod-certificate pods start now; they are checked once the socket's are.
	podCerts := startPodCertificates(t)
	pods := map[string]*corev1.Pod{}
	for name, sa := range map[string]string{"client-a": "alice", "client-b": "bob"} {
		if _, err := core.Pods(appsNamespace).Create(ctx, clientPod(name, sa), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods[sa] = nil
		_ = name
	}
	pods["alice"] = waitPodRunning(t, appsNamespace, "client-a")
	pods["bob"] = waitPodRunning(t, appsNamespace, "client-b")
	for sa, p := range pods {
		r := waitServed(t, p, sa, time.Time{})
		t.Logf("%s: Workload API %s, SDS %s, rm: %s", p.Name, r.WorkloadAPI, r.SDS, r.RemoveErr)
		if n := csiMounts(t, p); n != 1 {
			t.Fatalf("%s: %d mounts under its CSI volumes, want 1", p.Name, n)
		}
	}
	logCgroup(t, pods["alice"])
	// The agent's own view, read from its loopback (the list refuses any other
	// caller): each identity is held for exactly one pod, counted, never named.
	checkDebugCertsLoopbackOnly(t, agent)
	certs := debugCerts(t, agent)
	var held []struct {
		Identity string `json:"identity"`
		Pods     int    `json:"pods"`
	}
	if err := json.Unmarshal([]byte(certs), &held); err != nil {
		t.Fatalf("/debug/certs: %v", err)
	}
	for sa, p := range pods {
		want := fmt.Sprintf("spiffe://cluster.local/ns/%s/sa/%s", appsNamespace, sa)
		found := false
		for _, h := range held {
			if h.Identity == want {
				found = true
				if h.Pods != 1 {
					t.Fatalf("the agent holds %s for %d pods, want 1 (%s)", want, h.Pods, p.Name)
				}
			}
		}
		if !found {
			t.Fatalf("the agent holds no certificate for %s", want)
		}
		if strings.Contains(certs, p.Name) {
			t.Fatalf("/debug/certs names pod %s:\n%s", p.Name, certs)
		}
	}

	podCerts.check(t)
	// istiod's injector with the documented template: the real pilot-agent hands
	// this node agent's socket to Envoy.
	checkInjection(t, agent)

	// Restarting the agent pod: the volumes keep the socket directory, the new agent's
	// socket appears in it, nothing is mounted again.
	restart := time.Now()
	if err := core.Pods(agentNamespace).Delete(ctx, agent.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	agent = agentPod(t, agent.Name)
	t.Logf("new node agent %s Ready %.1fs after the old one was deleted", agent.Name, time.Since(restart).Seconds())
	for sa, p := range pods {
		waitServed(t, p, sa, time.Now())
		if n := csiMounts(t, p); n != 1 {
			t.Fatalf("after the agent restarted, %s: %d mounts under its CSI volumes, want 1", p.Name, n)
		}
	}

	// Restarting the kubelet: it publishes every volume again; the driver mounts nothing.
	kube.StopKubelet()
	if err := kube.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitNodeReady(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(15 * time.Second) // the kubelet's volume reconciler runs a few periods
	for sa, p := range pods {
		waitServed(t, p, sa, time.Now())
		if n := csiMounts(t, p); n != 1 {
			t.Fatalf("after the kubelet restarted, %s: %d mounts under its CSI volumes, want 1", p.Name, n)
		}
	}
	podCerts.recheck(t, "the agent's and the kubelet's restarts")
	if waitRefresh() {
		podCerts.refresh(t)
	}
	csiLog := containerLog(socketPod(t), "csi")
	t.Logf("CSI driver after the kubelet restart: %d publishes answered without mounting", strings.Count(csiLog, "already published"))

	// Deleting a pod unmounts its volume and releases its identity.
	if !strings.Contains(debugCerts(t, agent), "/sa/bob") {
		t.Fatal("/debug/certs does not list bob's identity while client-b runs")
	}
	if err := core.Pods(appsNamespace).Delete(ctx, "client-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, err := core.Pods(appsNamespace).Get(ctx, "client-b", metav1.GetOptions{})
		certs := debugCerts(t, agent)
		if err != nil && csiMounts(t, pods["bob"]) == 0 && !strings.Contains(certs, "/sa/bob") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("client-b deleted: pod gone %v, %d mounts left, identity still held: %v", err != nil, csiMounts(t, pods["bob"]), strings.Contains(certs, "/sa/bob"))
		}
		time.Sleep(time.Second)
	}
	waitServed(t, pods["alice"], "alice", time.Now())

	// The apps go first (their volumes need the driver to be unmounted), then the release.
	if err := core.Namespaces().Delete(ctx, appsNamespace, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "the apps' pods", func() bool {
		l, err := core.Pods(appsNamespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0 && csiMounts(t, pods["alice"]) == 0
	})
	run(t, "helm", "uninstall", release, "--namespace", agentNamespace, "--wait", "--timeout", "2m")
	checkNothingLeft(t, agentNamespace, release)
}

func waitGone(t *testing.T, what string, gone func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !gone() {
		if time.Now().After(deadline) {
			t.Fatalf("%s still there after 2 minutes", what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// checkNothingLeft checks that an uninstalled release left no object of its own, no
// CSI driver registration and no CSI mount on the node.
func checkNothingLeft(t *testing.T, ns, rel string) {
	t.Helper()
	ctx := context.Background()
	c := kube.Client()
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + rel}
	waitGone(t, "the release's pods", func() bool {
		l, err := c.CoreV1().Pods(ns).List(ctx, sel)
		return err == nil && len(l.Items) == 0
	})
	var left []string
	if l, _ := c.CoreV1().ServiceAccounts(ns).List(ctx, sel); len(l.Items) > 0 {
		left = append(left, "service accounts")
	}
	if l, _ := c.AppsV1().DaemonSets(ns).List(ctx, sel); len(l.Items) > 0 {
		left = append(left, "daemonsets")
	}
	if l, _ := c.AppsV1().Deployments(ns).List(ctx, sel); len(l.Items) > 0 {
		left = append(left, "deployments")
	}
	if l, _ := c.RbacV1().Roles(ns).List(ctx, sel); len(l.Items) > 0 {
		left = append(left, "roles")
	}
	if l, _ := c.RbacV1().ClusterRoles().List(ctx, sel); len(l.Items) > 0 {
		left = append(left, "cluster roles")
	}
	if l, _ := c.RbacV1().ClusterRoleBindings().List(ctx, sel); len(l.Items) > 0 {
		left = append(left, "cluster role bindings")
	}
	if _, err := c.StorageV1().CSIDrivers().Get(ctx, "csi.meshagent.io", metav1.GetOptions{}); err == nil {
		left = append(left, "the CSIDriver")
	}
	for _, p := range []string{
		filepath.Join(cluster.KubeletDir, "plugins_registry", "csi.meshagent.io-reg.sock"),
		filepath.Join(cluster.KubeletDir, "plugins", "csi.meshagent.io", "csi.sock"),
	} {
		if _, err := os.Stat(p); err == nil {
			left = append(left, p)
		}
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), "kubernetes.io~csi") {
		left = append(left, "CSI mounts")
	}
	if len(left) > 0 {
		t.Fatalf("helm uninstall %s left: %s", rel, strings.Join(left, ", "))
	}
}

// logCgroup logs the cgroup path the kubelet made for a pod's container, as the node
// agent's resolver reads it from /proc/<pid>/cgroup, with the cgroup root of this
// cluster's kubelet.
func logCgroup(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	root, err := podcgroup.ParseRoot(cluster.CgroupRoot + "/kubepods")
	if err != nil {
		t.Fatal(err)
	}
	pid := podPID(t, pod)
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := root.Parse(cg)
	if err != nil {
		t.Fatalf("the resolver's parser refuses the kubelet's cgroup of %s: %v\n%s", pod.Name, err, cg)
	}
	if parsed.UID != string(pod.UID) {
		t.Fatalf("parsed pod UID %v from %s, want %s", parsed.UID, cg, pod.UID)
	}
	for _, line := range strings.Split(string(cg), "\n") {
		if strings.Contains(line, "pids:") {
			t.Logf("%s: pid %d, /proc/%d/cgroup %s -> pod %v", pod.Name, pid, pid, line, parsed.UID)
		}
	}
}

//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/meshagent/meshagent/test/istiod"
)

const day2Namespace = "e2e-day2"

// installNodeAgent installs the node agent as docs/kubernetes.md says, with
// istiod as CA, and returns its Ready pod.
func installNodeAgent(t *testing.T) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	core := kube.Client().CoreV1()
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	waitRoots(t, agentNamespace)
	start := time.Now()
	run(t, "helm", "install", release, filepath.Join(repoRoot(), "deploy", "helm", "meshagent"),
		"--namespace", agentNamespace,
		"--set", "sidecar.enabled=false,node.enabled=true,image.pullPolicy=Never",
		"--set", "caAddress="+istiodAddr,
		"--set", "istiodSAN="+caServerName,
		"--wait", "--timeout", "3m")
	agent := agentPod(t, "")
	t.Logf("node agent %s Ready %.1fs after helm install", agent.Name, time.Since(start).Seconds())
	return agent
}

// checkAgentReadyBeforeLabel is the install order of docs/istio.md: every
// node's agent and node socket pod Ready before a namespace is labelled for
// the template.
func checkAgentReadyBeforeLabel(t *testing.T) {
	t.Helper()
	for _, name := range []string{release, release + "-socket"} {
		ds, err := kube.Client().AppsV1().DaemonSets(agentNamespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ds.Status.DesiredNumberScheduled == 0 || ds.Status.NumberReady != ds.Status.DesiredNumberScheduled {
			t.Fatalf("install order: DaemonSet %s is Ready on %d of %d nodes; label namespaces only once it is Ready on all",
				name, ds.Status.NumberReady, ds.Status.DesiredNumberScheduled)
		}
	}
}

// checkZtunnelTrusted shows that the CA_TRUSTED_NODE_ACCOUNTS of docs/istio.md
// keeps ambient working: a pod of istio-system/ztunnel on the node gets, with
// its own pod-bound token, the certificate of another identity with a pod on
// its node (ImpersonatedIdentity), as ztunnel asks.
func checkZtunnelTrusted(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	core := kube.Client().CoreV1()
	if _, err := core.ServiceAccounts(istiod.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ztunnel"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ztunnel-stand-in", Namespace: istiod.Namespace},
		Spec: corev1.PodSpec{
			ServiceAccountName:            "ztunnel",
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "idle", Image: clientImage, ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{{Name: "SOCKET", Value: "/nonexistent/socket"}, {Name: "INTERVAL", Value: "10s"}},
			}},
		},
	}
	if _, err := core.Pods(istiod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = core.Pods(istiod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{}) })
	p := waitPodRunning(t, istiod.Namespace, pod.Name)
	tr, err := core.ServiceAccounts(istiod.Namespace).CreateToken(ctx, "ztunnel", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:         []string{"istio-ca"},
		ExpirationSeconds: ptr.To[int64](600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	chain, err := impersonateIn(t, tr.Status.Token, id)
	if err != nil {
		t.Fatalf("istiod refused istio-system/ztunnel asking for %s: %v (CA_TRUSTED_NODE_ACCOUNTS must keep ztunnel)", id, err)
	}
	certs, err := parsePEMCerts([]byte(strings.Join(chain, "")))
	if err != nil || len(certs) == 0 || len(certs[0].URIs) == 0 || certs[0].URIs[0].String() != id {
		t.Fatalf("istiod's answer to ztunnel: %v %v", certs, err)
	}
	t.Logf("ambient beside it: istiod signed %s for istio-system/ztunnel's impersonated request", id)
}

// impersonateIn is one CreateCertificate to the cluster's istiod (dialled in
// the cluster's network namespace) with token and ImpersonatedIdentity id.
func impersonateIn(t *testing.T, token, id string) ([]string, error) {
	t.Helper()
	ctx := context.Background()
	roots := waitRoots(t, istiod.Namespace)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(roots)
	cc, err := grpc.NewClient("passthrough:///"+istiodAddr,
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: caServerName, MinVersion: tls.VersionTLS12})),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var c net.Conn
			err := kube.InNetns(func() error {
				var d net.Dialer
				var err error
				c, err = d.DialContext(ctx, "tcp", addr)
				return err
			})
			return c, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	return istiod.Impersonate(ctx, cc, token, id)
}

// nodeTemplatePod is a pod of day2Namespace injected with the node agent's
// template of docs/kubernetes.md, its Envoy stand-in holding one SDS stream
// as Envoy does (set through ProxyConfig's proxyMetadata, which pilot-agent
// passes to Envoy's environment).
func nodeTemplatePod(name, templates string) *corev1.Pod {
	return injectedPod(day2Namespace, name, "dave", templates, map[string]string{
		"proxy.istio.io/config": `{"proxyMetadata":{"ENVOY_STANDIN_SDS_STREAM":"true"}}`,
	})
}

// streamGap reads the stand-in's stream lines of pod after since: when its
// stream first broke, and when it was first answered again after that.
func streamGap(t *testing.T, ns, name string, since time.Time) (broke, served time.Time) {
	t.Helper()
	p, err := kube.Client().CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range standInLines(p) {
		if l.Kind != "sds" || !l.Stream || !l.Time.After(since) {
			continue
		}
		if l.Error != "" && broke.IsZero() {
			broke = l.Time
		}
		if l.Error == "" && !broke.IsZero() && served.IsZero() {
			served = l.Time
		}
	}
	return broke, served
}

// agentRun returns the host pid of the node agent's `meshagent run` process
// (not its CSI driver's) in pod.
func agentRun(t *testing.T, pod *corev1.Pod) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cg, err := os.ReadFile(filepath.Join(d, "cgroup"))
		if err != nil || !strings.Contains(string(cg), "pod"+string(pod.UID)) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(d, "cmdline"))
		args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
		if len(args) >= 2 && strings.HasSuffix(args[0], "meshagent") && args[1] == "run" {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	t.Fatalf("no meshagent run process in pod %s", pod.Name)
	return 0
}

// readyWithIdentity waits until pod ns/name is Ready and its stand-in holds its
// identity; it returns both times and the restarts of istio-proxy.
func readyWithIdentity(t *testing.T, ns, name, want string, within time.Duration) (ready, identity time.Time, restarts int32) {
	t.Helper()
	core := kube.Client().CoreV1()
	deadline := time.Now().Add(within)
	for {
		p, err := core.Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			if identity.IsZero() {
				for _, l := range standInLines(p) {
					if l.Kind == "sds" && l.SpiffeID == want && l.Error == "" {
						identity = l.Time
						break
					}
				}
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && ready.IsZero() {
					ready = c.LastTransitionTime.Time
				}
			}
			for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
				if s.Name == "istio-proxy" {
					restarts = s.RestartCount
				}
			}
			if !ready.IsZero() && !identity.IsZero() {
				return ready, identity, restarts
			}
		}
		if time.Now().After(deadline) {
			log := "(no pod)"
			if p != nil {
				log = tail(containerLog(p, "istio-proxy"), 3000)
			}
			t.Fatalf("%s/%s: Ready %v, identity %v, istio-proxy restarts %d after %s\nistio-proxy log:\n%s", ns, name, !ready.IsZero(), !identity.IsZero(), restarts, within, log)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestNodeAgentDay2: the node agent's life under Istio's injector, as
// docs/istio.md and docs/operations.md give it, on one install:
//   - install order: the agent Ready before the namespace is labelled;
//   - ambient beside it: istio-system/ztunnel keeps its impersonation;
//   - upgrade under traffic: `helm upgrade` to a new image while proxyless
//     workloads call each other every 100 ms and an injected pod's Envoy
//     stand-in holds its SDS stream: no call fails; the time until the stream
//     is answered again and the CSRs istiod received are printed;
//   - agent away, three rounds of each: a pod created while the agent
//     container restarts, and one created while the whole agent pod is away
//     (the node socket pod, with the socket holder and the CSI driver,
//     running), is Ready with its identity within 10 s of the agent's return;
//     istio-proxy never restarts; the steady pod's stream is answered again;
//     the upgrade left the node socket pod alone;
//   - rollback: without the template a restarted pod gets its certificate
//     from istiod through pilot-agent alone, and still after `helm uninstall`.
func TestNodeAgentDay2(t *testing.T) {
	ctx := context.Background()
	core := kube.Client().CoreV1()
	controlPlane(t)
	agent := installNodeAgent(t)
	injectionWebhook(t, waitRoots(t, istiod.Namespace))
	checkAgentReadyBeforeLabel(t)
	meshNamespace(t, day2Namespace, "dave")
	want := spiffeIDIn(day2Namespace, "dave")

	// The steady pod: its stand-in holds one SDS stream to the node agent.
	if _, err := core.Pods(day2Namespace).Create(ctx, nodeTemplatePod("steady", "sidecar,meshagent"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitStandIn(t, day2Namespace, "steady", want, time.Time{}, 3*time.Minute)
	t.Logf("steady pod: stream answered %s (serial %s)", first.SpiffeID, first.Serial)
	checkZtunnelTrusted(t, want)

	// Upgrade under traffic.
	startProxylessMesh(t, 24*time.Hour)
	before := waitCall(t, "a proxyless call before the upgrade", time.Time{}, func(l echoLine) bool { return l.OK })
	tag := agentTag(t) + "-next"
	if err := kube.ImportImage(nextAgentImage(t, tag)); err != nil {
		t.Fatal(err)
	}
	held := len(heldCerts(t, agent, 15020))
	csrs := istiodCSRs(t)
	sockBefore := socketPod(t)
	upgrade := time.Now()
	run(t, "helm", "upgrade", release, filepath.Join(repoRoot(), "deploy", "helm", "meshagent"),
		"--namespace", agentNamespace, "--reuse-values", "--set", "image.tag="+tag, "--wait", "--timeout", "3m")
	agent = agentPod(t, agent.Name)
	if !strings.HasSuffix(agent.Spec.Containers[0].Image, ":"+tag) {
		t.Fatalf("the agent pod after the upgrade runs %s, want tag %s", agent.Spec.Containers[0].Image, tag)
	}
	var broke, served time.Time
	deadline := time.Now().Add(2 * time.Minute)
	for served.IsZero() {
		if broke, served = streamGap(t, day2Namespace, "steady", upgrade); served.IsZero() {
			if time.Now().After(deadline) {
				t.Fatalf("the steady pod's SDS stream was not answered again within 2 minutes of the upgrade (broke at %v)", broke)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	time.Sleep(2 * time.Second) // calls after the new agent is serving
	var calls int
	var last echoLine
	for _, l := range echoLines(t, "client") {
		if l.Time.After(upgrade) {
			calls++
			last = l
		}
	}
	failed := last.FailuresAfterOK - before.FailuresAfterOK
	upgradeCSRs := istiodCSRs(t) - csrs
	t.Logf("upgrade under traffic: helm upgrade to %s; %d proxyless calls, %d failed; the SDS stream broke %.1fs after the upgrade began and was answered again %.1fs later (%.1fs after it began); istiod received %d CSRs (the agent held %d identities)",
		tag, calls, failed, broke.Sub(upgrade).Seconds(), served.Sub(broke).Seconds(), served.Sub(upgrade).Seconds(), upgradeCSRs, held)
	if calls < 50 {
		t.Fatalf("only %d proxyless calls during the upgrade", calls)
	}
	if failed != 0 {
		t.Fatalf("%d of %d proxyless calls failed during the upgrade", failed, calls)
	}
	if upgradeCSRs > held+1 {
		t.Fatalf("istiod received %d CSRs during the upgrade; the agent held %d identities (each is asked for once)", upgradeCSRs, held)
	}
	if sockAfter := socketPod(t); sockAfter.UID != sockBefore.UID {
		t.Fatalf("the upgrade replaced the node socket pod %s by %s: it must hold the socket while the agent's pod is replaced", sockBefore.Name, sockAfter.Name)
	}

	// The agent container restarting, the node socket pod running: a second
	// crash soon after the first keeps it down for the kubelet's restart
	// back-off, which grows with each round; a pod created meanwhile.
	const rounds = 3
	if err := syscall.Kill(agentRun(t, agent), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitAgentRestarted(t, agent, 1)
	for r := 1; r <= rounds; r++ {
		if err := syscall.Kill(agentRun(t, agent), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		down := time.Now()
		name := fmt.Sprintf("during-restart-%d", r)
		if _, err := core.Pods(day2Namespace).Create(ctx, nodeTemplatePod(name, "sidecar,meshagent"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		back := waitAgentBack(t, agent, int32(r+1))
		ready, identity, restarts := readyWithIdentity(t, day2Namespace, name, want, 3*time.Minute)
		t.Logf("agent container restart %d/%d: down %.1fs; the pod created meanwhile had its identity %.1fs and was Ready %.1fs after the agent's return (Ready with its identity %.1fs after); istio-proxy restarts: %d",
			r, rounds, back.Sub(down).Seconds(), identity.Sub(back).Seconds(), ready.Sub(back).Seconds(), both(ready, identity).Sub(back).Seconds(), restarts)
		checkWithin(t, "after the agent container's restart", back, ready, identity, restarts, 10*time.Second)
		deletePod(t, day2Namespace, name)
	}

	// The whole agent pod away (its DaemonSet kept off the node; the node socket
	// pod stays), a pod created meanwhile; the steady pod keeps the
	// certificate it holds and its stream is answered again.
	for r := 1; r <= rounds; r++ {
		away := time.Now()
		run(t, "kubectl", "-n", agentNamespace, "patch", "daemonset", release, "--type", "merge",
			"-p", `{"spec":{"template":{"spec":{"nodeSelector":{"meshagent.test/away":"true"}}}}}`)
		waitGone(t, "the node agent's pod", func() bool {
			l, err := core.Pods(agentNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node"})
			return err == nil && len(l.Items) == 0
		})
		name := fmt.Sprintf("during-absence-%d", r)
		if _, err := core.Pods(day2Namespace).Create(ctx, nodeTemplatePod(name, "sidecar,meshagent"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(15 * time.Second)
		run(t, "kubectl", "-n", agentNamespace, "patch", "daemonset", release, "--type", "json",
			"-p", `[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]`)
		agent = agentPod(t, "")
		back := agentReadySince(t, agent)
		ready, identity, restarts := readyWithIdentity(t, day2Namespace, name, want, 3*time.Minute)
		var steady time.Time
		deadline := time.Now().Add(time.Minute)
		for steady.IsZero() && time.Now().Before(deadline) {
			if _, steady = streamGap(t, day2Namespace, "steady", away); steady.IsZero() {
				time.Sleep(250 * time.Millisecond)
			}
		}
		if steady.IsZero() {
			t.Fatal("the steady pod's SDS stream was not answered again after the agent pod's absence")
		}
		t.Logf("agent pod away %d/%d for %.1fs: the pod created meanwhile had its identity %.1fs and was Ready %.1fs after the agent's return (Ready with its identity %.1fs after); istio-proxy restarts: %d; the steady pod's stream answered again %.1fs after it",
			r, rounds, back.Sub(away).Seconds(), identity.Sub(back).Seconds(), ready.Sub(back).Seconds(), both(ready, identity).Sub(back).Seconds(), restarts, steady.Sub(back).Seconds())
		checkWithin(t, "after the agent pod's absence", back, ready, identity, restarts, 10*time.Second)
		deletePod(t, day2Namespace, name)
	}

	// Rollback (docs/istio.md): the template removed, the pods restarted without
	// it, none left on the CSI volume, then helm uninstall.
	rollback := nodeTemplatePod("rolled-back", "sidecar")
	if _, err := core.Pods(day2Namespace).Create(ctx, rollback, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := core.Pods(day2Namespace).Delete(ctx, "steady", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "the pods on the CSI volume", func() bool { return len(csiPods(t)) == 0 })
	checkPilotAgentAlone(t, "rolled-back", want)
	run(t, "helm", "uninstall", release, "--namespace", agentNamespace, "--wait", "--timeout", "2m")
	checkNothingLeft(t, agentNamespace, release)
	// A pod restarted after the uninstall.
	if err := core.Pods(day2Namespace).Delete(ctx, "rolled-back", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "the rolled-back pod", func() bool {
		_, err := core.Pods(day2Namespace).Get(ctx, "rolled-back", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if _, err := core.Pods(day2Namespace).Create(ctx, nodeTemplatePod("rolled-back", "sidecar"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	checkPilotAgentAlone(t, "rolled-back", want)
	if err := core.Namespaces().Delete(ctx, day2Namespace, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// both is when a pod was Ready with its identity: the later of the two. The
// pod's Ready comes from pilot-agent's readiness, which the Envoy stand-in
// gives before it holds a certificate: a pod may be Ready before the agent
// is back.
func both(ready, identity time.Time) time.Time {
	if ready.After(identity) {
		return ready
	}
	return identity
}

// deletePod deletes pod ns/name and waits until it is gone.
func deletePod(t *testing.T, ns, name string) {
	t.Helper()
	core := kube.Client().CoreV1()
	if err := core.Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "pod "+ns+"/"+name, func() bool {
		_, err := core.Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// socketPod returns the node socket DaemonSet's Ready pod (the socket holder
// and the CSI driver).
func socketPod(t *testing.T) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		l, err := kube.Client().CoreV1().Pods(agentNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node-socket"})
		if err == nil {
			for i := range l.Items {
				p := &l.Items[i]
				for _, c := range p.Status.Conditions {
					if p.DeletionTimestamp == nil && c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
						return p
					}
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatal("the node socket pod is not Ready")
	return nil
}

// checkWithin fails unless the pod was Ready with its identity within bound
// of the agent's return, istio-proxy never restarted.
func checkWithin(t *testing.T, what string, back, ready, identity time.Time, restarts int32, bound time.Duration) {
	t.Helper()
	if restarts != 0 {
		t.Errorf("%s: istio-proxy restarted %d times", what, restarts)
	}
	for name, at := range map[string]time.Time{"Ready": ready, "its identity": identity} {
		if at.Sub(back) > bound {
			t.Errorf("%s: the pod had %s %.1fs after the agent's return, want within %s", what, name, at.Sub(back).Seconds(), bound)
		}
	}
}

// waitAgentRestarted waits until the agent container of pod restarted
// restarts times and runs.
func waitAgentRestarted(t *testing.T, pod *corev1.Pod, restarts int32) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		p, err := kube.Client().CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err == nil {
			for _, s := range p.Status.ContainerStatuses {
				if s.Name == "meshagent" && s.RestartCount >= restarts && s.State.Running != nil {
					return
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the agent container did not restart %d times", restarts)
}

// waitAgentBack waits until the agent container of pod restarted restarts
// times and is Ready again, and returns when it became Ready.
func waitAgentBack(t *testing.T, pod *corev1.Pod, restarts int32) time.Time {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		p, err := kube.Client().CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err == nil {
			for _, s := range p.Status.ContainerStatuses {
				if s.Name == "meshagent" && s.RestartCount >= restarts && s.Ready {
					return agentReadySince(t, p)
				}
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatal("the agent container did not come back Ready")
	return time.Time{}
}

// agentReadySince is when the agent pod last became Ready.
func agentReadySince(t *testing.T, pod *corev1.Pod) time.Time {
	t.Helper()
	for range 40 {
		p, err := kube.Client().CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return c.LastTransitionTime.Time
				}
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("agent pod %s not Ready", pod.Name)
	return time.Time{}
}

// csiPods lists the pods that mount the node agent's CSI volume: the check of
// the rollback runbook before helm uninstall.
func csiPods(t *testing.T) []string {
	t.Helper()
	l, err := kube.Client().CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range l.Items {
		for _, v := range p.Spec.Volumes {
			if v.CSI != nil && v.CSI.Driver == "csi.meshagent.io" {
				out = append(out, p.Namespace+"/"+p.Name)
			}
		}
	}
	return out
}

// checkPilotAgentAlone: pod name of day2Namespace, without the template, gets
// its certificate from istiod through pilot-agent's own CA client and SDS
// server, on the emptyDir workload-socket.
func checkPilotAgentAlone(t *testing.T, name, want string) {
	t.Helper()
	l := waitStandIn(t, day2Namespace, name, want, time.Time{}, 3*time.Minute)
	p, err := kube.Client().CoreV1().Pods(day2Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range p.Spec.Volumes {
		if v.Name == "workload-socket" && v.CSI != nil {
			t.Fatalf("%s still mounts the CSI volume", name)
		}
	}
	log := containerLog(p, "istio-proxy")
	if strings.Contains(log, "Existing workload SDS socket found") || !strings.Contains(log, "generated new workload certificate") {
		t.Fatalf("%s: pilot-agent did not get the certificate itself:\n%s", name, tail(log, 3000))
	}
	t.Logf("rollback: %s got %s (serial %s) from istiod through pilot-agent alone", name, l.SpiffeID, l.Serial)
}

// agentTag is the tag of the agent image make image built (the chart's appVersion).
func agentTag(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "helm", "meshagent", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "appVersion:"); ok {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	t.Fatal("Chart.yaml has no appVersion")
	return ""
}

// nextAgentImage writes the agent image under another tag, from the binary of
// make image (tools/image): what the upgrade installs.
func nextAgentImage(t *testing.T, tag string) string {
	t.Helper()
	root := repoRoot()
	tar := filepath.Join(t.TempDir(), "next.tar")
	out, err := exec.Command(filepath.Join(root, "bin", "image-tool"), "-binary", filepath.Join(root, "bin", "meshagent"), "-tag", agentImage+":"+tag, "-o", tar).CombinedOutput()
	if err != nil {
		t.Fatalf("the next agent image: %v\n%s", err, out)
	}
	return tar
}

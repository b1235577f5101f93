package podresolver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/test/podproc"
)

// signalWait is the real index, telling the test when a lookup starts
// waiting.
type signalWait struct {
	*podindex.Index
	waiting chan string
}

func (s signalWait) Wait(ctx context.Context, uid string) (podindex.Pod, error) {
	s.waiting <- uid
	return s.Index.Wait(ctx, uid)
}

// noWait fails the test if a lookup waited for its pod.
func noWait(t *testing.T, pods signalWait) {
	t.Helper()
	select {
	case uid := <-pods.waiting:
		t.Errorf("the lookup waited for pod %s, which the index had", uid)
	default:
	}
}

// drainWait takes the signal of a lookup that may or may not have waited.
func drainWait(pods signalWait) {
	select {
	case <-pods.waiting:
	default:
	}
}

func runIndex(t *testing.T, idx *podindex.Index) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- idx.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("index: %v", err)
		}
	})
}

// TestNodeCallers resolves real processes in pod cgroups against the pods a
// real API server has on the node.
func TestNodeCallers(t *testing.T) {
	kube := kube.Env(t)
	ctx := context.Background()
	ns := fmt.Sprintf("shop-%d", time.Now().UnixNano())
	if _, err := kube.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cart", "payments"} {
		if _, err := kube.CreateServiceAccount(ctx, ns, name); err != nil {
			t.Fatal(err)
		}
	}
	mustPod := func(name, sa, node string) *corev1.Pod {
		t.Helper()
		p, err := kube.CreatePod(ctx, ns, name, sa, node)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cart := mustPod("cart-0", "cart", "node-1")
	pay := mustPod("pay-0", "payments", "node-1")
	far := mustPod("cart-far", "cart", "node-2")
	done := mustPod("job-0", "cart", "node-1")
	cur, err := kube.Client().CoreV1().Pods(ns).Get(ctx, done.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.Phase = corev1.PodFailed
	if _, err := kube.Client().CoreV1().Pods(ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The index is not running yet: the first lookup must wait for it.
	idx, err := podindex.New(podindex.Config{Pods: agentClient(t, kube), NodeName: "node-1", Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	pods := signalWait{idx, make(chan string, 10)}
	r, err := New(Config{Pods: pods, PodWait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cartProc := podproc.Start(t, podproc.Cgroupfs, string(cart.UID), cid)
	payProc := podproc.Start(t, podproc.Systemd, string(pay.UID), cid)

	type result struct {
		info caller.Info
		err  error
	}
	late := make(chan result, 1)
	go func() {
		info, err := r.Resolve(ctx, caller.Cred{UID: 1000, PID: int32(cartProc.Process.Pid)})
		late <- result{info, err}
	}()
	if uid := <-pods.waiting; uid != string(cart.UID) {
		t.Fatalf("waiting for pod %s, want %s", uid, cart.UID)
	}
	runIndex(t, idx)
	res := <-late
	if res.err != nil {
		t.Fatalf("pod that reached the informer late: %v", res.err)
	}
	want := caller.Info{Cred: caller.Cred{UID: 1000, PID: int32(cartProc.Process.Pid)}, Identity: sid("spiffe://cluster.local/ns/" + ns + "/sa/cart"), Pod: ns + "/cart-0", PodUID: string(cart.UID)}
	if res.info != want {
		t.Fatalf("cart resolved to %+v, want %+v", res.info, want)
	}

	// The other pod, over the systemd-shaped cgroup, gets its own identity
	// (waiting or not: the informer may not have delivered it yet).
	info, err := r.Resolve(ctx, caller.Cred{UID: 1000, PID: int32(payProc.Process.Pid)})
	drainWait(pods)
	if err != nil || info.Identity.String() != "spiffe://cluster.local/ns/"+ns+"/sa/payments" || info.PodUID != string(pay.UID) {
		t.Fatalf("payments resolved to %+v, %v", info, err)
	}
	// A pod the index has is answered without waiting.
	if info, err := r.Resolve(ctx, caller.Cred{UID: 1000, PID: int32(cartProc.Process.Pid)}); err != nil || info != want {
		t.Fatalf("cart resolved again to %+v, %v", info, err)
	}
	noWait(t, pods)

	// Refused: a pod of another node, a cgroup of no pod, a terminated pod,
	// a dead process. Short waits: these never become known.
	r.cfg.PodWait = 300 * time.Millisecond
	farProc := podproc.Start(t, podproc.Cgroupfs, string(far.UID), cid)
	strayProc := podproc.Start(t, podproc.Cgroupfs, "12345678-9abc-4def-8123-456789abcdef", cid)
	doneProc := podproc.Start(t, podproc.Systemd, string(done.UID), cid)
	for _, tt := range []struct {
		name   string
		pid    int
		reason string
		waits  bool // the pod is never in the index: the lookup waits PodWait
	}{
		{"pod of another node", farProc.Process.Pid, ReasonPodUnknown, true},
		{"cgroup of no pod", strayProc.Process.Pid, ReasonPodUnknown, true},
		{"failed pod", doneProc.Process.Pid, ReasonPodTerminated, false},
	} {
		_, err := r.Resolve(ctx, caller.Cred{UID: 1000, PID: int32(tt.pid)})
		if tt.waits {
			<-pods.waiting
		} else {
			drainWait(pods)
		}
		wantRefusal(t, err, tt.reason)
		for _, other := range []string{string(cart.UID), string(pay.UID), "cart-0", "pay-0"} {
			if strings.Contains(err.Error(), other) {
				t.Errorf("%s: refusal %q names another pod", tt.name, err)
			}
		}
	}
	podproc.Kill(payProc)
	_, err = r.Resolve(ctx, caller.Cred{UID: 1000, PID: int32(payProc.Process.Pid)})
	wantRefusal(t, err, ReasonProcessGone)

	if got := testutil.ToFloat64(r.metrics.refused.WithLabelValues(ReasonPodUnknown)); got != 2 {
		t.Errorf("refused{pod_unknown} = %v, want 2", got)
	}
}

package nodemode

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/podproc"
)

// The chart runs the node agent as a non-root uid with no capability:
// SO_PEERCRED, the connection's pidfd and other processes' cgroup and stat
// files need none, so pods are served as under root, and callers are
// refused as under root.
func TestUnprivilegedNodeAgent(t *testing.T) {
	ns := namespace(t, "unpriv")
	n := startNodeAs(t, &syscall.Credential{Uid: 10101, Gid: 10101}, uniq("node"))
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.agent.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok && strings.TrimSpace(v) != "0000000000000000" {
			t.Fatalf("the agent holds capabilities: %s", line)
		}
		if v, ok := strings.CutPrefix(line, "Uid:"); ok && strings.Fields(v)[1] != "10101" {
			t.Fatalf("the agent runs as %s", line)
		}
	}
	cart := pod(t, ns, "cart-0", "cart", n.name)
	if got, want := startCaller(t, n.agent.Socket(), callerOpts{podUID: string(cart.UID), shape: podproc.Systemd}).fetch(), "ok "+spiffe(ns, "cart"); got != want {
		t.Errorf("cart-0: %q, want %s", got, want)
	}
	if got := startCaller(t, n.agent.Socket(), callerOpts{podUID: string(cart.UID), shape: podproc.Delegated}).fetch(); !strings.Contains(got, "outside the kubelet's cgroup root") {
		t.Errorf("a delegated cgroup named after cart-0: %q, want refused", got)
	}
	if got := startCaller(t, n.agent.Socket(), callerOpts{}).fetch(); !strings.Contains(got, "is not in a pod") {
		t.Errorf("a node process: %q, want refused", got)
	}
}

// Certificates are fetched ahead only for pods that ask for it
// (meshagent.io/prefetch: "true"); a pod that does not (kube-system's, an
// unmeshed one) costs no CSR until its first request.
func TestPrefetchOnlyForPodsThatAsk(t *testing.T) {
	ns := namespace(t, "prefetch")
	name := uniq("node")
	asks := pod(t, ns, "asks-0", "asks", name)
	quiet := pod(t, ns, "quiet-0", "quiet", name)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, podindex.PrefetchAnnotation)
	if _, err := kube.Env(t).Client().CoreV1().Pods(ns).Patch(context.Background(), asks.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, name)
	asksID, quietID := spiffe(ns, "asks"), spiffe(ns, "quiet")
	csrs := func(id string) int {
		k := 0
		for _, r := range n.ca.CSRs() {
			if r.Identity == id {
				k++
			}
		}
		return k
	}
	testwait.Within(t, 30*time.Second, "the certificate of the pod that asks is fetched ahead", func() bool {
		_, held := n.certs()[asksID]
		return held
	})
	if k := csrs(quietID); k != 0 {
		t.Fatalf("%d CSRs for a pod that did not ask, before its first request", k)
	}
	if got := startCaller(t, n.agent.Socket(), callerOpts{podUID: string(quiet.UID), shape: podproc.Cgroupfs}).fetch(); got != "ok "+quietID {
		t.Fatalf("quiet-0: %q, want %s", got, quietID)
	}
	if k := csrs(quietID); k != 1 {
		t.Errorf("%d CSRs for quiet-0's identity after its first request, want 1", k)
	}
}

package nodemode

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

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

package nodemode

import (
	"strings"
	"testing"

	"github.com/meshagent/meshagent/test/podproc"
)

// TestNodeConnectionFlood: a pod that opens more connections than
// MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER is refused the extra ones,
// naming the setting, and another pod of the node is served meanwhile.
func TestNodeConnectionFlood(t *testing.T) {
	ns := namespace(t, "flood")
	n := startNode(t, uniq("node"), "MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER=8")
	sock := n.agent.Socket()
	hog := pod(t, ns, "hog-0", "hog", n.name)
	calm := pod(t, ns, "calm-0", "calm", n.name)
	flooder := startCaller(t, sock, callerOpts{podUID: string(hog.UID), shape: podproc.Cgroupfs})
	got := flooder.do("conns 40")
	if !strings.HasPrefix(got, "served 8 refused ResourceExhausted") || !strings.Contains(got, "MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER") {
		t.Fatalf("40 connections of one pod: %q, want 8 served and the rest refused naming the setting", got)
	}
	other := startCaller(t, sock, callerOpts{podUID: string(calm.UID), shape: podproc.Systemd})
	if got := other.fetch(); got != "ok "+spiffe(ns, "calm") {
		t.Fatalf("another pod while one is at its limit: %q", got)
	}
	if v := n.metric(`meshagent_socket_refused_total{reason="max_connections"}`); v < 32 {
		t.Errorf("refused connections counted: %v, want 32", v)
	}
}

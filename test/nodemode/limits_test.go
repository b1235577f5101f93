package nodemode

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

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
	// Every attempt counts against the pod's connection rate (checked
	// first, before the caller is identified): past its burst the rest
	// are refused for the rate.
	conns, rate := n.metric(`meshagent_socket_refused_total{reason="max_connections"}`), n.metric(`meshagent_socket_refused_total{reason="max_connection_rate"}`)
	if conns < 1 || conns+max(0, rate) < 32 {
		t.Errorf("refused connections counted: %v for the limit and %v for the rate, want 32 together", conns, rate)
	}
}

// TestNodeRefusalFlood: one pod opens 5,000 connections at once. The agent
// keeps MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER of them and refuses the
// others at their handshake, without a gRPC transport: its peak RSS stays
// under 80 MB and its log (at info) under 200 lines, the refusals are counted, and
// another pod is served meanwhile.
func TestNodeRefusalFlood(t *testing.T) {
	const conns, maxRSS, maxLines = 5000, 80 << 10, 200
	ns := namespace(t, "refusals")
	n := startNode(t, uniq("node"))
	sock := n.agent.Socket()
	hog := pod(t, ns, "hog-0", "hog", n.name)
	calm := pod(t, ns, "calm-0", "calm", n.name)
	other := startCaller(t, sock, callerOpts{podUID: string(calm.UID), shape: podproc.Systemd})
	if got := other.fetch(); got != "ok "+spiffe(ns, "calm") {
		t.Fatalf("before the flood: %q", got)
	}
	linesBefore := infoLines(n.agent.Logs())
	flooder := startCaller(t, sock, callerOpts{podUID: string(hog.UID), shape: podproc.Cgroupfs})
	got := flooder.do(fmt.Sprintf("flood %d", conns))
	if got := other.fetch(); got != "ok "+spiffe(ns, "calm") {
		t.Fatalf("another pod during the flood: %q", got)
	}
	hwm := vmHWM(t, n.agent.Pid())
	lines := infoLines(n.agent.Logs()) - linesBefore
	// A refusal is counted just after its connection is closed.
	var refused float64
	for deadline := time.Now().Add(10 * time.Second); refused < conns-32 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		refused = 0
		for _, reason := range []string{"max_connections", "max_connection_rate", "handshakes"} {
			refused += max(0, n.metric(`meshagent_socket_refused_total{reason="`+reason+`"}`))
		}
	}
	t.Logf("%d connections of one pod: %s; agent peak RSS %d kB, %d log lines, %v refusals counted", conns, got, hwm, lines, refused)
	if !strings.HasPrefix(got, "flood closed ") || !strings.HasSuffix(got, " open 32") {
		t.Errorf("flood: %q, want all but 32 closed", got)
	}
	if hwm > maxRSS {
		t.Errorf("agent peak RSS %d kB during the flood, want under %d kB", hwm, maxRSS)
	}
	if lines > maxLines {
		t.Errorf("%d log lines for the flood, want under %d", lines, maxLines)
	}
	if refused < conns-32 {
		_, metrics := n.get("/metrics")
		var series []string
		for _, l := range strings.Split(metrics, "\n") {
			if strings.Contains(l, "refused_total{") {
				series = append(series, l)
			}
		}
		t.Errorf("%v refusals counted, want %d:\n%s", refused, conns-32, strings.Join(series, "\n"))
	}
}

// infoLines counts the log lines at info level and above (the agent's
// default; the tests' agents log at debug).
func infoLines(logs string) int {
	n := 0
	for _, l := range strings.Split(logs, "\n") {
		if l != "" && !strings.Contains(l, `"level":"debug"`) {
			n++
		}
	}
	return n
}

// vmHWM is the peak resident set of process pid, in kB.
func vmHWM(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

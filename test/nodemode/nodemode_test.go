package nodemode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/podproc"
)

func spiffe(ns, sa string) string { return "spiffe://cluster.local/ns/" + ns + "/sa/" + sa }

// TestPodsOfOneNode: one agent, one socket, the pods of its node from the
// API server, callers in real pod cgroups, the CA authenticating the agent
// by its own pod-bound token and checking every impersonation.
func TestPodsOfOneNode(t *testing.T) {
	ns := namespace(t, "shop")
	const nodeUID, nodeUIDListed = 4321, 4322
	noPodID := spiffe(ns, "nopod")
	n := startNode(t, uniq("node"), "MESHAGENT_NODE_UID_IDENTITIES="+strconv.Itoa(nodeUIDListed)+"="+noPodID)
	sock := n.agent.Socket()

	cart := pod(t, ns, "cart-0", "cart", n.name)
	pay := pod(t, ns, "pay-0", "payments", n.name)
	far := pod(t, ns, "far-0", "cart", "node-elsewhere")
	gone := pod(t, ns, "gone-0", "leaving", n.name)
	intruder := pod(t, ns, "intruder-0", "intruder", n.name)
	cartID, payID, goneID := spiffe(ns, "cart"), spiffe(ns, "payments"), spiffe(ns, "leaving")

	// A pod that goes away while its process holds a stream: the stream
	// ends, saying why, and the identity is dropped (TestNodePodLeft).
	leaving := startCaller(t, sock, callerOpts{podUID: string(gone.UID), shape: podproc.Cgroupfs})
	if got := leaving.do("stream"); got != "ok "+goneID {
		t.Fatalf("leaving-0 stream: %q, want %s", got, goneID)
	}
	zero := int64(0)
	if err := kube.Env(t).Client().CoreV1().Pods(ns).Delete(context.Background(), gone.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}

	t.Run("each pod its own identity", func(t *testing.T) {
		a := startCaller(t, sock, callerOpts{podUID: string(cart.UID), shape: podproc.Cgroupfs})
		b := startCaller(t, sock, callerOpts{podUID: string(pay.UID), shape: podproc.Systemd})
		if got := a.fetch(); got != "ok "+cartID {
			t.Errorf("cart-0: %q, want %s", got, cartID)
		}
		if got := b.fetch(); got != "ok "+payID {
			t.Errorf("pay-0: %q, want %s", got, payID)
		}
		// Asking for names never yields another identity.
		// Asking for names never yields another identity: the answer is
		// refused, or holds the caller's own certificate only.
		onlyOwn := func(c *caller, own string, names ...string) {
			t.Helper()
			got := c.fetch(names...)
			certs, ok := strings.CutPrefix(got, "ok ")
			if !ok {
				if !strings.HasPrefix(got, "error ") {
					t.Errorf("asking for %v: %q", names, got)
				}
				return
			}
			for i, uri := range strings.Fields(certs) {
				if uri != "-" && uri != own {
					t.Errorf("asking for %v: %s answered with %s, want nothing but %s", names, names[i], uri, own)
				}
			}
		}
		for _, names := range [][]string{{payID}, {"default", payID}, {"payments"}, {"default", "ROOTCA"}, {"file-cert:/etc/hostname~/etc/hostname"}, {"default", "default"}} {
			onlyOwn(a, cartID, names...)
		}
		onlyOwn(b, payID, cartID)
		onlyOwn(b, payID, "default", "ROOTCA")
		if d := n.ca.Denials(); len(d) != 0 {
			t.Errorf("CA denials %v", d)
		}
	})

	refused := func(t *testing.T, who, got string) {
		t.Helper()
		if !strings.HasPrefix(got, "error "+codes.PermissionDenied.String()) {
			t.Errorf("%s: %q, want PermissionDenied", who, got)
		}
	}
	t.Run("refused callers", func(t *testing.T) {
		refused(t, "a pod of another node", startCaller(t, sock, callerOpts{podUID: string(far.UID), shape: podproc.Cgroupfs}).fetch())
		refused(t, "a pod cgroup no pod owns", startCaller(t, sock, callerOpts{podUID: "0badc0de-1111-4222-8333-444455556666", shape: podproc.Systemd}).fetch())
		// A node user with a delegated cgroup subtree names a cgroup after
		// cart-0 (served above in its own cgroup): not under the kubelet's
		// root, so not cart-0.
		got := startCaller(t, sock, callerOpts{podUID: string(cart.UID), shape: podproc.Delegated}).fetch()
		refused(t, "a delegated cgroup named after another pod", got)
		if !strings.Contains(got, "outside the kubelet's cgroup root") {
			t.Errorf("delegated cgroup refusal %q does not say why", got)
		}
		got = startCaller(t, sock, callerOpts{cred: &syscall.Credential{Uid: nodeUID, Gid: nodeUID}}).fetch()
		refused(t, "a node process of an unlisted uid", got)
		if !strings.Contains(got, "is not in a pod") {
			t.Errorf("node process refusal %q does not say why", got)
		}
	})

	t.Run("reused pid", func(t *testing.T) {
		// A process of the intruder's pod connects, hands the connection to
		// another process and exits; its pid goes to a process of pay-0
		// before the connection's first request. The connection was
		// identified when it was accepted: it is the intruder's (or refused,
		// if its process had exited by then), never pay-0's.
		attacker := startCaller(t, sock, callerOpts{podUID: string(intruder.UID), shape: podproc.Cgroupfs})
		if got := attacker.do("handoff"); got != "sent" {
			t.Fatalf("handoff: %q", got)
		}
		nc := attacker.receiveConn()
		conn := clientOver(t, nc)
		pid := attacker.cmd.Process.Pid
		attacker.exit()
		victim := podproc.StartWithPID(t, pid)
		defer podproc.Kill(victim) // if Move fails
		podproc.Move(t, victim.Process.Pid, podproc.Cgroupfs, string(pay.UID), containerID)
		t.Cleanup(func() { podproc.Kill(victim) })

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := secretv3.NewSecretDiscoveryServiceClient(conn).FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{ResourceNames: []string{"default"}})
		switch {
		case err == nil:
			if got := describeDiscovery(t, resp); got != "ok "+spiffe(ns, "intruder") {
				t.Fatalf("first request after the pid was reused: %s, want the intruder's own identity", got)
			}
		case status.Code(err) == codes.PermissionDenied:
			// Refused at accept, or at the first request: its process exited.
		default:
			t.Fatalf("first request after the pid was reused: %v, %v; want the intruder's identity or PermissionDenied, the connecting process exited", resp, err)
		}
	})

	t.Run("CA refuses an identity with no pod on the node", func(t *testing.T) {
		// A node process whose uid the operator gave an identity no pod of
		// the node has: the agent asks on its behalf, the CA's node
		// authorizer refuses.
		d := startCaller(t, sock, callerOpts{cred: &syscall.Credential{Uid: nodeUIDListed, Gid: nodeUIDListed}})
		if got := d.do("fetch 5 default"); strings.HasPrefix(got, "ok") {
			t.Fatalf("identity with no pod on the node issued: %q", got)
		}
		testwait.Within(t, 30*time.Second, "the refusal is counted", func() bool {
			return n.metric(`meshagent_ca_impersonated_requests_total{provider="istio",result="refused"}`) >= 1
		})
		if !strings.Contains(n.agent.Logs(), "the CA refused the impersonation") {
			t.Errorf("the agent did not log the refusal")
		}
		denied := n.ca.Denials()
		if !slices.ContainsFunc(denied, func(s string) bool { return strings.Contains(s, "no pod of "+ns+"/nopod runs on node "+n.name) }) {
			t.Errorf("CA denials %v, want the missing pod of nopod on %s", denied, n.name)
		}
		// Other identities are unaffected, old and new.
		if got := startCaller(t, sock, callerOpts{podUID: string(cart.UID), shape: podproc.Cgroupfs}).fetch(); got != "ok "+cartID {
			t.Errorf("cart-0 after the refusal: %q", got)
		}
		late := pod(t, ns, "late-0", "late", n.name)
		if got := startCaller(t, sock, callerOpts{podUID: string(late.UID), shape: podproc.Systemd}).fetch(); got != "ok "+spiffe(ns, "late") {
			t.Errorf("a new pod after the refusal: %q", got)
		}
	})

	// The deleted pod's stream ended, and its identity is dropped.
	if got := leaving.do("next"); !strings.HasPrefix(got, "error PermissionDenied") || !strings.Contains(got, "was deleted") {
		t.Fatalf("the deleted pod's stream: %q, want it ended naming the deletion", got)
	}
	testwait.Within(t, 30*time.Second, "the deleted pod's identity is dropped after its stream ended", func() bool {
		_, held := n.certs()[goneID]
		return !held
	})
}

// TestTwentyIdentitiesTwentyCSRs: 200 pods of 20 service accounts on the
// node: one certificate per identity, fetched ahead (every pod's, by
// MESHAGENT_NODE_PREFETCH_ALL), shared by its pods.
func TestTwentyIdentitiesTwentyCSRs(t *testing.T) {
	ns := namespace(t, "fleet")
	name := uniq("node")
	uids := map[string][]string{}
	for p := range 200 {
		sa := fmt.Sprintf("sa-%02d", p%20)
		uids[sa] = append(uids[sa], string(pod(t, ns, fmt.Sprintf("pod-%03d", p), sa, name).UID))
	}
	n := startNode(t, name, "MESHAGENT_NODE_PREFETCH_ALL=true")
	prefix := "spiffe://cluster.local/ns/" + ns + "/"
	csrs := func() map[string]int {
		out := map[string]int{}
		for _, r := range n.ca.CSRs() {
			out[r.Identity]++
		}
		return out
	}
	testwait.Within(t, 60*time.Second, "20 identities held", func() bool {
		held := 0
		for id := range n.certs() {
			if strings.HasPrefix(id, prefix) {
				held++
			}
		}
		return held == 20
	})
	// Callers of two pods of each of five accounts, all at once.
	var wg sync.WaitGroup
	for i := range 5 {
		sa := fmt.Sprintf("sa-%02d", i*4)
		for _, uid := range uids[sa][:2] {
			c := startCaller(t, n.agent.Socket(), callerOpts{podUID: uid, shape: podproc.Shape(i % 2)})
			wg.Go(func() {
				if got := c.fetch(); got != "ok "+prefix+"sa/"+sa {
					t.Errorf("pod of %s: %q", sa, got)
				}
			})
		}
	}
	wg.Wait()
	got := csrs()
	total := 0
	for id, k := range got {
		switch {
		case strings.HasPrefix(id, prefix):
			total++
			if k != 1 {
				t.Errorf("%d CSRs for %s, want 1", k, id)
			}
		case id == n.ownIdentity():
			if k != 1 {
				t.Errorf("%d CSRs for the agent's own identity, want 1", k)
			}
		default:
			t.Errorf("%d CSRs for %q", k, id)
		}
	}
	if total != 20 {
		t.Errorf("CSRs for %d identities of the 200 pods, want 20: %v", total, got)
	}
	if v := n.metric(`meshagent_node_identity_pods{identity="` + prefix + `sa/sa-07"}`); v != 10 {
		t.Errorf("meshagent_node_identity_pods of sa-07 = %v, want 10", v)
	}
}

// clientOver is a gRPC client whose one connection is nc, once the agent
// has accepted it (no request made).
func clientOver(t *testing.T, nc net.Conn) *grpc.ClientConn {
	t.Helper()
	var once sync.Once
	cc, err := grpc.NewClient("passthrough:///handed-off", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
			var c net.Conn
			once.Do(func() { c = nc })
			if c == nil {
				return nil, errors.New("the handed-off connection is used up")
			}
			return c, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc.Connect()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			t.Fatalf("the handed-off connection never became ready (%v)", s)
		}
	}
	return cc
}

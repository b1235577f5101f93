package test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gsworkloadapi "github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/heavy"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/podproc"
)

// svidClientEnv makes the test binary, started again as a child, a
// go-spiffe client of the Workload API socket it names: once a line arrives
// on stdin (the parent has moved it into a pod's cgroup) it fetches its
// X.509 SVIDs and prints "svids <id> ..." or "error <message>".
const svidClientEnv = "MESHAGENT_TEST_SVID_CLIENT"

func svidClient(socket string) int {
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Println("error reading the go-ahead:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	x, err := gsworkloadapi.FetchX509Context(ctx, gsworkloadapi.WithAddr("unix://"+socket))
	if err != nil {
		fmt.Println("error", err)
		return 0
	}
	ids := []string{}
	for _, s := range x.SVIDs {
		ids = append(ids, s.ID.String())
	}
	fmt.Println("svids", strings.Join(ids, " "))
	return 0
}

// svidAsPod runs svidClient in container podproc.ContainerID(0) of pod uid (no pod when uid
// is empty: a node process) and returns what it printed.
func svidAsPod(t *testing.T, socket, uid string) string {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), svidClientEnv+"="+socket)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer podproc.Kill(child) // before Move's cleanup removes the cgroup
	if uid != "" {
		podproc.Move(t, child.Process.Pid, podproc.Cgroupfs, uid, podproc.ContainerID(0))
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(stdout)
	return strings.TrimSpace(string(out))
}

// TestNodeModeWorkloadAPIGivesEachPodItsSVID runs the agent binary in node
// mode against a real API server and the test CA's node authorizer: go-spiffe
// clients in the cgroups of two pods of different service accounts each get
// their own SVID over the one socket and only that one, and a process in no
// pod is refused.
func TestNodeModeWorkloadAPIGivesEachPodItsSVID(t *testing.T) {
	heavy.Skip(t, "starts etcd and kube-apiserver")
	ctx := context.Background()
	kube, err := kubeenv.Start(ctx, kubeenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.Stop() })
	const ns, node = "shop", "node-wl"
	if _, err := kube.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"cart", "payments", "meshagent"} {
		if _, err := kube.CreateServiceAccount(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	uid := map[string]string{}
	for pod, sa := range map[string]string{"cart-0": "cart", "pay-0": "payments"} {
		p, err := kube.CreatePod(ctx, ns, pod, sa, node)
		if err != nil {
			t.Fatal(err)
		}
		uid[pod] = string(p.UID)
	}
	agentPod, err := kube.CreatePod(ctx, ns, "meshagent-node", "meshagent", node)
	if err != nil {
		t.Fatal(err)
	}
	token, err := kube.Token(ctx, ns, "meshagent", []string{istioca.DefaultAudience}, agentPod, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ca := istioca.Start(t, istioca.Config{
		Kube:                kube.Client(),
		TrustedNodeAccounts: []istioca.ServiceAccount{{Namespace: ns, Name: "meshagent"}},
	})

	dir := agentproc.TempDir(t)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := kube.Kubeconfig(kubeconfig, kube.AdminToken()); err != nil {
		t.Fatal(err)
	}
	flWrite(t, filepath.Join(dir, "istio-token"), []byte(token))
	flWrite(t, filepath.Join(dir, "root-cert.pem"), ca.RootPEM())
	p := agentproc.Start(t, dir, flEnv(
		"CA_ADDR="+ca.Addr(),
		"ISTIOD_SAN="+istioca.DefaultServerName,
		"CA_ROOT_CA="+filepath.Join(dir, "root-cert.pem"),
		"MESHAGENT_TOKEN_PATH="+filepath.Join(dir, "istio-token"),
		"POD_NAMESPACE="+ns,
		"SERVICE_ACCOUNT=meshagent",
		"POD_NAME=meshagent-node",
		"MESHAGENT_MODE=node",
		"NODE_NAME="+node,
		"KUBECONFIG="+kubeconfig,
	)...)

	// The socket appears once the agent serves (after the pod list).
	testwait.Within(t, 30*time.Second, "the agent's socket", func() bool {
		if _, err := os.Stat(p.Socket()); err == nil {
			return true
		}
		select {
		case <-p.Done():
			t.Fatalf("agent exited before serving:\n%s", p.Logs())
		default:
		}
		return false
	})
	for _, c := range []struct{ pod, want string }{
		{"cart-0", "spiffe://cluster.local/ns/shop/sa/cart"},
		{"pay-0", "spiffe://cluster.local/ns/shop/sa/payments"},
	} {
		if got := svidAsPod(t, p.Socket(), uid[c.pod]); got != "svids "+c.want {
			t.Errorf("go-spiffe in pod %s got %q, want only its own SVID %s\nagent logs:\n%s", c.pod, got, c.want, p.Logs())
		}
	}
	got := svidAsPod(t, p.Socket(), "")
	if !strings.HasPrefix(got, "error") || !strings.Contains(got, "PermissionDenied") {
		t.Errorf("go-spiffe in no pod got %q, want PermissionDenied", got)
	}
	// The CA was asked for each pod's identity under the agent's token,
	// never for one with no pod on the node.
	var ids []string
	for _, c := range ca.CSRs() {
		ids = append(ids, c.Identity)
	}
	for _, want := range []string{"spiffe://cluster.local/ns/shop/sa/cart", "spiffe://cluster.local/ns/shop/sa/payments"} {
		if !slices.Contains(ids, want) {
			t.Errorf("CSRs at the CA %v, want one for %s", ids, want)
		}
	}
	if d := ca.Denials(); len(d) > 0 {
		t.Errorf("the CA refused impersonation: %v", d)
	}
}

package nodemode

import (
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
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/status"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istioca"
)

// agentSA is the node agent's service account name, in its own namespace.
const agentSA = "meshagent"

// node is one node of a test: its name, the agent's namespace and pod, the
// CA that trusts the agent's service account, and the running agent.
type node struct {
	t      *testing.T
	name   string
	sys    string // the agent's namespace
	ca     *istioca.Server
	agent  *agentproc.Proc
	status string   // http://127.0.0.1:<port>
	env    []string // the agent's environment, for restart
}

// uniq is a name no other test uses.
func uniq(prefix string) string { return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()) }

// startNode runs the built agent in node mode for node name, authenticated
// to the test CA by a token of its own service account bound to its own pod
// (as the kubelet projects it), the service account listed among the CA's
// trusted node accounts. The agent reads pods with an admin kubeconfig.
func startNode(t *testing.T, name string, env ...string) *node {
	t.Helper()
	return startNodeWith(t, nil, nil, name, env...)
}

// startNodeAs is startNode with the agent running as cred's uid and gid
// (nil: the test's own, root), as the chart runs it: no capability at all.
func startNodeAs(t *testing.T, cred *syscall.Credential, name string, env ...string) *node {
	t.Helper()
	return startNodeWith(t, cred, nil, name, env...)
}

// startNodeIn is startNode with prepare, when not nil, run on the agent's
// working directory before the agent starts.
func startNodeIn(t *testing.T, name string, prepare func(dir string), env ...string) *node {
	t.Helper()
	return startNodeWith(t, nil, prepare, name, env...)
}

// startNodeWith starts the agent as cred (nil: root) after prepare (nil:
// nothing) ran on its working directory.
func startNodeWith(t *testing.T, cred *syscall.Credential, prepare func(dir string), name string, env ...string) *node {
	t.Helper()
	kube := kube.Env(t)
	ctx := context.Background()
	n := &node{t: t, name: name, sys: uniq("sys")}
	if _, err := kube.CreateNamespace(ctx, n.sys); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CreateServiceAccount(ctx, n.sys, agentSA); err != nil {
		t.Fatal(err)
	}
	agentPod, err := kube.CreatePod(ctx, n.sys, "meshagent-"+name, agentSA, name)
	if err != nil {
		t.Fatal(err)
	}
	n.ca = istioca.Start(t, istioca.Config{Kube: kube.Client(),
		TrustedNodeAccounts: []istioca.ServiceAccount{{Namespace: n.sys, Name: agentSA}}})
	token, err := kube.Token(ctx, n.sys, agentSA, []string{istioca.DefaultAudience}, agentPod, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := agentproc.TempDir(t)
	// The socket directory is reached by callers of other uids (a host
	// directory on a node).
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "istio-token"), []byte(token))
	write(t, filepath.Join(dir, "root-cert.pem"), n.ca.RootPEM())
	if err := kube.Kubeconfig(filepath.Join(dir, "kubeconfig"), kube.AdminToken()); err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(dir)
	}
	if cred != nil {
		err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, int(cred.Uid), int(cred.Gid))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	port := freePort(t)
	n.status = "http://127.0.0.1:" + strconv.Itoa(port)
	n.env = append([]string{
		"MESHAGENT_MODE=node",
		"NODE_NAME=" + name,
		"KUBECONFIG=" + filepath.Join(dir, "kubeconfig"),
		"CA_ADDR=" + n.ca.Addr(),
		"ISTIOD_SAN=" + istioca.DefaultServerName,
		"CA_ROOT_CA=" + filepath.Join(dir, "root-cert.pem"),
		"MESHAGENT_TOKEN_PATH=" + filepath.Join(dir, "istio-token"),
		"POD_NAMESPACE=" + n.sys,
		"SERVICE_ACCOUNT=" + agentSA,
		"POD_NAME=" + agentPod.Name,
		"STATUS_PORT=" + strconv.Itoa(port),
		"MESHAGENT_STATUS_HOST=127.0.0.1",
		"MESHAGENT_LOG_LEVEL=debug",
		// An identity nobody holds is dropped after a second, not the
		// default minute, so the tests that see one dropped do not wait.
		"MESHAGENT_IDENTITY_IDLE_GRACE=1s",
	}, env...)
	n.agent = agentproc.StartAs(t, cred, dir, n.env...)
	n.waitReady()
	return n
}

// waitReady waits until the agent reports ready; it fails the test after a
// minute or when the agent exits.
func (n *node) waitReady() {
	t := n.t
	t.Helper()
	testwait.Within(t, 60*time.Second, "the agent ready", func() bool {
		code, body := n.get("/healthz/ready")
		if code == http.StatusOK {
			return true
		}
		if n.agent.ExitCode() >= 0 {
			t.Fatalf("agent not ready: %d %s", code, body)
		}
		return false
	})
}

// ownIdentity is the agent's own SPIFFE ID.
func (n *node) ownIdentity() string { return "spiffe://cluster.local/ns/" + n.sys + "/sa/" + agentSA }

func (n *node) get(path string) (int, string) {
	resp, err := http.Get(n.status + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// certs returns /debug/certs: how many pods use each identity held
// ("default").
func (n *node) certs() map[string]int {
	n.t.Helper()
	code, body := n.get("/debug/certs")
	if code != http.StatusOK {
		n.t.Fatalf("/debug/certs: %d %s", code, body)
	}
	var list []status.CertInfo
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		n.t.Fatalf("/debug/certs: %v\n%s", err, body)
	}
	out := map[string]int{}
	for _, c := range list {
		if c.ResourceName == "default" {
			out[c.Identity] = c.Pods
		}
	}
	return out
}

// metric returns the value of the series (name and labels as in the
// exposition), or -1 when absent.
func (n *node) metric(series string) float64 {
	n.t.Helper()
	_, body := n.get("/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				n.t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// pod creates a pod of service account sa (made if missing) in ns on node.
func pod(t *testing.T, ns, name, sa, nodeName string) *corev1.Pod {
	t.Helper()
	kube := kube.Env(t)
	ctx := context.Background()
	if _, err := kube.Client().CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{}); err != nil {
		if _, err := kube.CreateServiceAccount(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	p, err := kube.CreatePod(ctx, ns, name, sa, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func namespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := uniq(prefix)
	if _, err := kube.Env(t).CreateNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

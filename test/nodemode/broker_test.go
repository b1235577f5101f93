package nodemode

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	gsworkloadapi "github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/meshagent/meshagent/brokerapi/brokerpb"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/brokerclient"
	"github.com/meshagent/meshagent/test/podproc"
)

// fetchSVID is the child's "svid" command: the caller's X.509-SVID from the
// Workload API on the node socket, as a broker gets its own.
func fetchSVID(sock string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svid, err := gsworkloadapi.FetchX509SVID(ctx, gsworkloadapi.WithAddr("unix://"+sock))
	if err != nil {
		return "error " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	var chain []byte
	for _, c := range svid.Certificates {
		chain = append(chain, c.Raw...)
	}
	key, err := x509.MarshalPKCS8PrivateKey(svid.PrivateKey)
	if err != nil {
		return "error " + err.Error()
	}
	return "svid " + base64.StdEncoding.EncodeToString(chain) + " " + base64.StdEncoding.EncodeToString(key)
}

// brokerNode is a node agent serving the Broker API to the brokers
// allowed, with their reference types.
type brokerNode struct {
	*node
	socket string
}

func startBrokerNode(t *testing.T, brokers string, env ...string) *brokerNode {
	t.Helper()
	name := uniq("node")
	var socket string
	n := startNodeIn(t, name, func(dir string) { socket = filepath.Join(dir, "broker", "socket") },
		append([]string{"MESHAGENT_BROKER_SOCKET=" + filepath.Join("broker", "socket"), "MESHAGENT_BROKERS=" + brokers}, env...)...)
	return &brokerNode{node: n, socket: socket}
}

// broker is a broker process in a pod of the node: its SVID comes from the
// Workload API on the node socket, attested by its cgroup; the test calls
// the Broker API with it.
func (b *brokerNode) broker(t *testing.T, p *corev1.Pod) *brokerclient.Client {
	t.Helper()
	proc := startCaller(t, b.agent.Socket(), callerOpts{podUID: string(p.UID), shape: podproc.Cgroupfs})
	got := proc.do("svid")
	f := strings.Fields(got)
	if len(f) != 3 || f[0] != "svid" {
		t.Fatalf("broker %s: its own SVID from the Workload API: %q", p.Name, got)
	}
	chain, err1 := base64.StdEncoding.DecodeString(f[1])
	key, err2 := base64.StdEncoding.DecodeString(f[2])
	if err1 != nil || err2 != nil {
		t.Fatalf("broker %s: %v %v", p.Name, err1, err2)
	}
	svid, err := x509svid.ParseRaw(chain, key)
	if err != nil {
		t.Fatal(err)
	}
	if want := spiffe(p.Namespace, p.Spec.ServiceAccountName); svid.ID.String() != want {
		t.Fatalf("broker %s: own SVID of %s, want %s", p.Name, svid.ID, want)
	}
	return b.client(t, svid)
}

func (b *brokerNode) client(t *testing.T, svid x509svid.Source) *brokerclient.Client {
	t.Helper()
	bundle, err := x509bundle.Parse(spiffeid.RequireTrustDomainFromString("cluster.local"), b.ca.RootPEM())
	if err != nil {
		t.Fatal(err)
	}
	c, err := brokerclient.Dial(b.socket, svid, bundle, spiffeid.RequireFromString(b.ownIdentity()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func brokerCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// firstSVID is the first answer of SubscribeToX509SVID for ref: "ok
// <SPIFFE ID>" or "error <code> <message>".
func firstSVID(t *testing.T, c *brokerclient.Client, ref *brokerpb.WorkloadReference) string {
	t.Helper()
	resp, err := c.FirstSVID(brokerCtx(t), ref)
	return svidOf(t, resp, err)
}

func svidOf(t *testing.T, resp *brokerpb.SubscribeToX509SVIDResponse, err error) string {
	t.Helper()
	if err != nil {
		return fmt.Sprintf("error %s %s", status.Code(err), status.Convert(err).Message())
	}
	svid, bundle, err := brokerclient.ParseSVID(resp)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, bundle); err != nil {
		t.Fatalf("SVID of %s does not verify against its bundle: %v", svid.ID, err)
	}
	return "ok " + svid.ID.String()
}

// TestBrokerAPI: a broker pod gets its own SVID from the Workload API on
// the node socket, then the SVIDs of the node's workloads by pid and by pod
// reference from the built agent, on the real API server; every refusal
// the standard names; a trust change pushed on the open stream; the stream
// after an agent restart.
func TestBrokerAPI(t *testing.T) {
	ns := namespace(t, "broker")
	brokers := spiffe(ns, "ztunnel") + "=pid,pod;" + spiffe(ns, "pidonly") + "=pid"
	n := startBrokerNode(t, brokers)
	ztunnel := n.broker(t, pod(t, ns, "ztunnel-0", "ztunnel", n.name))
	web := pod(t, ns, "web-0", "web", n.name)
	webProc := startCaller(t, n.agent.Socket(), callerOpts{podUID: string(web.UID), shape: podproc.Systemd})
	webID := spiffe(ns, "web")

	t.Run("SVIDs by reference", func(t *testing.T) {
		for name, ref := range map[string]*brokerpb.WorkloadReference{
			"pid":      brokerclient.PIDRef(int32(webProc.cmd.Process.Pid)),
			"key":      brokerclient.PodRef(ns, "web-0", ""),
			"uid":      brokerclient.PodRef("", "", string(web.UID)),
			"key, uid": brokerclient.PodRef(ns, "web-0", string(web.UID)),
		} {
			if got := firstSVID(t, ztunnel, ref); got != "ok "+webID {
				t.Errorf("by %s: %s, want %s", name, got, webID)
			}
		}
	})

	t.Run("refusals", func(t *testing.T) {
		far := pod(t, ns, "far-0", "web", "node-elsewhere")
		done := pod(t, ns, "done-0", "job", n.name)
		setPhase(t, ns, done, corev1.PodSucceeded)
		stranger := n.broker(t, pod(t, ns, "stranger-0", "stranger", n.name))
		pidOnly := n.broker(t, pod(t, ns, "pidonly-0", "pidonly", n.name))
		noHeader := n.broker(t, pod(t, ns, "ztunnel-1", "ztunnel", n.name))
		noHeader.NoHeader = true
		farProc := startCaller(t, n.agent.Socket(), callerOpts{podUID: string(far.UID), shape: podproc.Cgroupfs})
		tests := []struct {
			name string
			c    *brokerclient.Client
			ref  *brokerpb.WorkloadReference
			want string // prefix of svidOf
		}{
			{"no header", noHeader, brokerclient.PodRef(ns, "web-0", ""), "error InvalidArgument security header missing"},
			{"unlisted broker", stranger, brokerclient.PodRef(ns, "web-0", ""), "error PermissionDenied not an allowed broker"},
			{"reference type not allowed", pidOnly, brokerclient.PodRef(ns, "web-0", ""), "error PermissionDenied broker " + spiffe(ns, "pidonly") + " may not use"},
			{"another node's pod by key", ztunnel, brokerclient.PodRef(ns, "far-0", ""), "error NotFound"},
			{"another node's pod by uid", ztunnel, brokerclient.PodRef("", "", string(far.UID)), "error NotFound"},
			{"another node's pod by pid", ztunnel, brokerclient.PIDRef(int32(farProc.cmd.Process.Pid)), "error NotFound"},
			{"wrong uid", ztunnel, brokerclient.PodRef(ns, "web-0", string(far.UID)), "error NotFound pod " + ns + "/web-0: the pod of that name on this node has another UID"},
		}
		for _, tt := range tests {
			if got := firstSVID(t, tt.c, tt.ref); !strings.HasPrefix(got, tt.want) {
				t.Errorf("%s: %s, want %s...", tt.name, got, tt.want)
			}
		}
		// The finished pod: once the index has seen its phase.
		testwait.Within(t, time.Minute, "the finished pod refused: PermissionDenied, has finished", func() bool {
			got := firstSVID(t, ztunnel, brokerclient.PodRef(ns, "done-0", ""))
			return strings.HasPrefix(got, "error PermissionDenied") && strings.Contains(got, "has finished")
		})
		if got := n.metric(`meshagent_broker_refused_total{reason="not_broker"}`); got < 1 {
			t.Errorf("not_broker refusals counted %v", got)
		}
	})

	t.Run("trust change pushed", func(t *testing.T) {
		st, err := ztunnel.SVIDs(brokerCtx(t), brokerclient.PodRef(ns, "web-0", ""))
		if err != nil {
			t.Fatal(err)
		}
		first, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		other, err := localca.New(localca.Config{})
		if err != nil {
			t.Fatal(err)
		}
		roots := append(append([]byte{}, n.ca.RootPEM()...), other.RootPEM()...)
		write(t, filepath.Join(n.agent.Dir, "root-cert.pem"), roots)
		next, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		count := func(r *brokerpb.SubscribeToX509SVIDResponse) int {
			certs, err := x509.ParseCertificates(r.GetSvids()[0].GetBundle())
			if err != nil {
				t.Fatal(err)
			}
			return len(certs)
		}
		if a, b := count(first), count(next); a != 1 || b != 2 {
			t.Fatalf("bundle of %d roots, then %d; want 1, then 2", a, b)
		}
	})

	t.Run("agent restart", func(t *testing.T) {
		st, err := ztunnel.SVIDs(brokerCtx(t), brokerclient.PodRef(ns, "web-0", ""))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		n.restart()
		if _, err := st.Recv(); status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
			t.Fatalf("the stream across the restart ended with %v, want Unavailable", err)
		}
		// The broker's connection comes back by itself.
		testwait.Within(t, time.Minute, "the broker's connection back after the restart", func() bool {
			return firstSVID(t, ztunnel, brokerclient.PIDRef(int32(webProc.cmd.Process.Pid))) == "ok "+webID
		})
	})
	if d := n.ca.Denials(); len(d) != 0 {
		t.Errorf("CA denials %v", d)
	}
}

// restart stops the agent and starts it again in the same directory.
func (n *node) restart() {
	n.t.Helper()
	n.agent.Stop()
	n.agent = agentproc.StartAs(n.t, nil, n.agent.Dir, n.env...)
	n.waitReady()
}

// TestBrokerHundredPods measures one broker subscribed to the SVIDs of 100
// pods of 20 service accounts by pod UID: time to each pod's first SVID,
// the agent's memory, and the CSRs it made. It prints the figures; it
// asserts only what does not depend on the machine's speed (one CSR per
// identity).
func TestBrokerHundredPods(t *testing.T) {
	const pods, accounts = 100, 20
	ns := namespace(t, "hundred")
	n := startBrokerNode(t, spiffe(ns, "ztunnel")+"=pod")
	ztunnel := n.broker(t, pod(t, ns, "ztunnel-0", "ztunnel", n.name))
	csrsBefore := len(n.ca.CSRs())
	rssBefore := vmRSS(t, n.agent.Pid())
	var uids []string
	for i := range pods {
		p := pod(t, ns, fmt.Sprintf("w-%d", i), fmt.Sprintf("sa-%d", i%accounts), n.name)
		uids = append(uids, string(p.UID))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	firsts := make([]time.Duration, pods)
	errs := make([]error, pods)
	streams := make([]brokerpb.API_SubscribeToX509SVIDClient, pods)
	start := time.Now()
	var wg sync.WaitGroup
	for i, uid := range uids {
		wg.Go(func() {
			st, err := ztunnel.SVIDs(ctx, brokerclient.PodRef("", "", uid))
			if err == nil {
				_, err = st.Recv()
			}
			firsts[i], errs[i], streams[i] = time.Since(start), err, st
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pod w-%d: %v", i, err)
		}
	}
	all := time.Since(start)
	runtime.GC()
	sort.Slice(firsts, func(i, j int) bool { return firsts[i] < firsts[j] })
	csrs := len(n.ca.CSRs()) - csrsBefore
	rss := vmRSS(t, n.agent.Pid())
	t.Logf("one broker, %d pods of %d service accounts, streams opened at once: first SVID p50 %v, p90 %v, max %v; all %d in %v; "+
		"CSRs %d; agent RSS %d kB before, %d kB with the %d streams open (peak %d kB)",
		pods, accounts, firsts[pods/2].Round(time.Millisecond), firsts[pods*9/10].Round(time.Millisecond), firsts[pods-1].Round(time.Millisecond),
		pods, all.Round(time.Millisecond), csrs, rssBefore, rss, pods, vmHWM(t, n.agent.Pid()))
	if csrs != accounts {
		t.Errorf("%d CSRs for %d identities, want one each", csrs, accounts)
	}
	if got := n.metric("meshagent_broker_streams"); got != pods {
		t.Errorf("meshagent_broker_streams = %v, want %d", got, pods)
	}
}

// vmRSS is the resident set of process pid, in kB.
func vmRSS(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb int
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

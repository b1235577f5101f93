package brokerapi_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/brokerapi"
	"github.com/meshagent/meshagent/brokerapi/brokerpb"
	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/node/podresolver"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/brokerclient"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	uidWeb  = "6f1c2b3a-1111-4222-8333-444455556666"
	uidDone = "6f1c2b3a-1111-4222-8333-777788889999"
	cid     = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

var (
	agentID   = pki.SPIFFEIdentity("cluster.local", "meshagent", "node")
	brokerID  = pki.SPIFFEIdentity("cluster.local", "istio-system", "ztunnel")
	pidOnlyID = pki.SPIFFEIdentity("cluster.local", "tunnel", "pid-only")
	strangerI = pki.SPIFFEIdentity("cluster.local", "default", "stranger")
	webID     = pki.SPIFFEIdentity("cluster.local", "shop", "web")
)

// pods are the node's pods as the pod index would list them.
type pods struct {
	mu sync.Mutex
	m  map[string]podindex.Pod
}

func (p *pods) Get(uid string) (podindex.Pod, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pod, ok := p.m[uid]
	return pod, ok
}

func (p *pods) Wait(ctx context.Context, uid string) (podindex.Pod, error) {
	if pod, ok := p.Get(uid); ok {
		return pod, nil
	}
	<-ctx.Done()
	return podindex.Pod{}, ctx.Err()
}

func (p *pods) ByName(ns, name string) (podindex.Pod, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pod := range p.m {
		if pod.Namespace == ns && pod.Name == name {
			return pod, true
		}
	}
	return podindex.Pod{}, false
}

func (p *pods) remove(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, uid)
}

func mkpod(ns, name, uid, sa string, phase kubeclient.PodPhase) podindex.Pod {
	return podindex.Pod{Namespace: ns, Name: name, UID: uid, ServiceAccount: sa, Phase: phase, Identity: pki.SPIFFEIdentity("cluster.local", ns, sa)}
}

// fakeProc writes <root>/<pid>/{task/<pid>/stat,cgroup}: a process of the pod uid.
func fakeProc(t testing.TB, root string, pid int, uid string) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := []string{strconv.Itoa(pid), "(app)", "S"}
	for i := 4; i <= 52; i++ {
		f = append(f, "7")
	}
	task := filepath.Join(dir, "task", strconv.Itoa(pid))
	if err := os.MkdirAll(task, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(task, "stat"), []byte(strings.Join(f, " ")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::/kubepods/besteffort/pod"+uid+"/"+cid+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// agent is the certificate cache on a fake clock with an in-process CA,
// and the Broker API served on a real Unix socket with real TLS.
type agent struct {
	socket string
	clock  *clocktesting.FakeClock
	mgr    *secretmanager.Manager
	srv    *brokerapi.Server
	pods   *pods
	reg    *prometheus.Registry
	td     *x509bundle.Bundle
	// procRoot is the /proc the resolver reads.
	procRoot string
	csrs     *countingCA
}

// countingCA counts the CSRs the cache makes.
type countingCA struct {
	caclient.Client
	n atomic.Int64
}

func (c *countingCA) Sign(ctx context.Context, csr []byte, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	c.n.Add(1)
	return c.Client.Sign(ctx, csr, id, ttl)
}

var (
	webPID = os.Getpid()
	farPID = os.Getppid()
)

func startAgent(t testing.TB, adjust func(*brokerapi.Config)) *agent {
	t.Helper()
	dir, err := os.MkdirTemp("", "brk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	a := &agent{socket: filepath.Join(dir, "broker", "socket"), reg: prometheus.NewRegistry()}
	a.clock = clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	ca, err := localca.New(localca.Config{Intermediate: true, Now: a.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := devca.New(devca.Config{CA: ca})
	if err != nil {
		t.Fatal(err)
	}
	roots, err := secret.NewRoots(ca.RootPEM(), "dev-ca")
	if err != nil {
		t.Fatal(err)
	}
	a.csrs = &countingCA{Client: dev}
	a.mgr, err = secretmanager.New(secretmanager.Config{Identity: agentID, CA: a.csrs, Roots: roots, TTL: time.Hour,
		Clock: a.clock, Rand: func() float64 { return 0.5 },
		GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a.td, err = x509bundle.Parse(spiffeid.RequireTrustDomainFromString("cluster.local"), ca.RootPEM())
	if err != nil {
		t.Fatal(err)
	}
	procRoot := t.TempDir()
	// The test process plays the web pod's process, its parent a process
	// of a pod of another node: pid references are pinned by real pidfds.
	fakeProc(t, procRoot, webPID, uidWeb)
	fakeProc(t, procRoot, farPID, "6f1c2b3a-1111-4222-8333-000000000000")
	a.procRoot = procRoot
	a.pods = &pods{m: map[string]podindex.Pod{
		uidWeb:  mkpod("shop", "web-0", uidWeb, "web", kubeclient.PodRunning),
		uidDone: mkpod("shop", "job-0", uidDone, "job", kubeclient.PodSucceeded),
	}}
	procs, err := podresolver.New(podresolver.Config{Pods: a.pods, ProcRoot: procRoot, PodWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cfg := brokerapi.Config{
		Socket: a.socket, Secrets: a.mgr, Processes: procs, Pods: a.pods, PodWait: time.Millisecond, Registerer: a.reg,
		Brokers: []brokerapi.Broker{
			{ID: spiffeid.RequireFromString(brokerID.SPIFFEID), PID: true, Pod: true},
			{ID: spiffeid.RequireFromString(pidOnlyID.SPIFFEID), PID: true},
		},
		MaxStreamsSetting: "MESHAGENT_BROKER_MAX_STREAMS", MaxWorkloadsSetting: "MESHAGENT_BROKER_MAX_WORKLOADS",
		MaxStreams: 1024, MaxWorkloads: 512,
	}
	if adjust != nil {
		adjust(&cfg)
	}
	if a.srv, err = brokerapi.New(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{a.mgr.Run, a.srv.Run} {
		wg.Go(func() {
			if err := run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	testwait.For(t, "the broker socket", func() bool { _, err := os.Stat(a.socket); return err == nil })
	return a
}

// client is a broker with the SVID of id, from the same cache (the broker
// would get it from the Workload API).
func (a *agent) client(t testing.TB, id pki.Identity) *brokerclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sec, err := a.mgr.Secret(ctx, id, secretmanager.WorkloadCertName)
	if err != nil {
		t.Fatal(err)
	}
	svid, err := x509svid.Parse(sec.CertChain, sec.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := brokerclient.Dial(a.socket, svid, a.td, spiffeid.RequireFromString(agentID.SPIFFEID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func callCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// wantStatus checks err's code and, when reason is set, its ErrorInfo.
func wantStatus(t *testing.T, err error, code codes.Code, reason, contains string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || !strings.Contains(st.Message(), contains) {
		t.Fatalf("error %v, want %s containing %q", err, code, contains)
	}
	if reason == "" {
		return
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if info.GetReason() != reason || info.GetDomain() != "spiffe.io" {
				t.Fatalf("ErrorInfo %v, want reason %s, domain spiffe.io", info, reason)
			}
			return
		}
	}
	t.Fatalf("error %v has no ErrorInfo, want reason %s", err, reason)
}

// An allowed broker gets the SVID of a pod of the node by key, by uid, by
// both, and by the pid of one of its processes: the pod's identity, a chain
// that verifies against the bundle, and its key.
func TestSVIDByReference(t *testing.T) {
	a := startAgent(t, nil)
	c := a.client(t, brokerID)
	for name, ref := range map[string]*brokerpb.WorkloadReference{
		"key":      brokerclient.PodRef("shop", "web-0", ""),
		"uid":      brokerclient.PodRef("", "", uidWeb),
		"key, uid": brokerclient.PodRef("shop", "web-0", uidWeb),
		"pid":      brokerclient.PIDRef(int32(webPID)),
	} {
		t.Run(name, func(t *testing.T) {
			resp, err := c.FirstSVID(callCtx(t), ref)
			if err != nil {
				t.Fatal(err)
			}
			svid, bundle, err := brokerclient.ParseSVID(resp)
			if err != nil {
				t.Fatal(err)
			}
			if svid.ID.String() != webID.SPIFFEID {
				t.Fatalf("SVID of %s, want %s", svid.ID, webID.SPIFFEID)
			}
			if _, _, err := x509svid.Verify(svid.Certificates, bundle); err != nil {
				t.Fatalf("the SVID does not verify against its bundle: %v", err)
			}
			if _, err := tls.X509KeyPair(pki.EncodeCertificates(svid.Certificates[:1]), mustKeyPEM(t, resp.GetSvids()[0].GetX509SvidKey())); err != nil {
				t.Fatalf("key does not match the certificate: %v", err)
			}
		})
	}
	// A response is counted once Send returns, which may be after the
	// broker has read it.
	testwait.Every(t, testwait.Timeout, time.Millisecond, "meshagent_broker_svids_sent_total to count the 4 responses", func() error {
		if got := testutil.ToFloat64(a.counter(t, "meshagent_broker_svids_sent_total")); got != 4 {
			return fmt.Errorf("it is %v", got)
		}
		return nil
	})
}

func (a *agent) counter(t *testing.T, name string) prometheus.Collector {
	t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x"}, func() float64 {
				sum := 0.0
				for _, m := range mf.GetMetric() {
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
				return sum
			})
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

func mustKeyPEM(t *testing.T, der []byte) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// Each refusal has the code the SPIFFE Broker Endpoint and API standards
// give, and is counted by reason.
func TestRefusals(t *testing.T) {
	a := startAgent(t, nil)
	broker := a.client(t, brokerID)
	noHeader := a.client(t, brokerID)
	noHeader.NoHeader = true
	stranger := a.client(t, strangerI)
	pidOnly := a.client(t, pidOnlyID)
	tests := []struct {
		name     string
		c        *brokerclient.Client
		ref      *brokerpb.WorkloadReference
		code     codes.Code
		reason   string // ErrorInfo reason
		contains string
		metric   string
	}{
		{"no header", noHeader, brokerclient.PodRef("shop", "web-0", ""), codes.InvalidArgument, "", "broker.spiffe.io", "header"},
		{"unlisted broker", stranger, brokerclient.PodRef("shop", "web-0", ""), codes.PermissionDenied, "", "not an allowed broker", "not_broker"},
		{"type not allowed", pidOnly, brokerclient.PodRef("shop", "web-0", ""), codes.PermissionDenied, "", "may not use KubernetesObjectReference", "reference_type_not_allowed"},
		{"no reference", broker, nil, codes.InvalidArgument, "WORKLOAD_REFERENCE_INVALID", "no workload reference", "reference_invalid"},
		{"unknown type", broker, brokerclient.Ref(durationpb.New(time.Second)), codes.InvalidArgument, "WORKLOAD_REFERENCE_INVALID", "google.protobuf.Duration", "reference_invalid"},
		{"not pods", broker, brokerclient.Ref(&brokerpb.KubernetesObjectReference{Type: &brokerpb.KubernetesObjectType{Plural: "deployments", Group: "apps"},
			Key: &brokerpb.KubernetesObjectKey{Namespace: "shop", Name: "web"}}), codes.InvalidArgument, "WORKLOAD_REFERENCE_INVALID", "only pods", "reference_invalid"},
		{"neither key nor uid", broker, brokerclient.PodRef("", "", ""), codes.InvalidArgument, "WORKLOAD_REFERENCE_INVALID", "neither key nor uid", "reference_invalid"},
		{"negative pid", broker, brokerclient.PIDRef(-1), codes.InvalidArgument, "WORKLOAD_REFERENCE_INVALID", "not a positive integer", "reference_invalid"},
		{"wrong uid", broker, brokerclient.PodRef("shop", "web-0", uidDone), codes.NotFound, "WORKLOAD_NOT_FOUND", "another UID", "workload_not_found"},
		{"pod of another node", broker, brokerclient.PodRef("shop", "web-far", ""), codes.NotFound, "WORKLOAD_NOT_FOUND", "no such pod on this node", "workload_not_found"},
		{"uid of another node", broker, brokerclient.PodRef("", "", "6f1c2b3a-1111-4222-8333-000000000000"), codes.NotFound, "WORKLOAD_NOT_FOUND", "no such pod", "workload_not_found"},
		{"process of another node's pod", broker, brokerclient.PIDRef(int32(farPID)), codes.NotFound, "WORKLOAD_NOT_FOUND", "not known on this node", "workload_not_found"},
		{"no such process", broker, brokerclient.PIDRef(1<<22 + 1), codes.NotFound, "WORKLOAD_NOT_FOUND", "has exited", "workload_not_found"},
		{"finished pod", broker, brokerclient.PodRef("shop", "job-0", ""), codes.PermissionDenied, "WORKLOAD_NOT_ENTITLED", "has finished", "workload_not_entitled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := refused(t, a, tt.metric)
			_, err := tt.c.FirstSVID(callCtx(t), tt.ref)
			wantStatus(t, err, tt.code, tt.reason, tt.contains)
			if got := refused(t, a, tt.metric); got != before+1 {
				t.Fatalf("meshagent_broker_refused_total{reason=%q} went from %v to %v, want one more", tt.metric, before, got)
			}
			// The bundles stream refuses alike.
			st, err := tt.c.Bundles(callCtx(t), tt.ref)
			if err == nil {
				_, err = st.Recv()
			}
			wantStatus(t, err, tt.code, tt.reason, tt.contains)
		})
	}
}

func refused(t *testing.T, a *agent, reason string) float64 {
	t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "meshagent_broker_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A client whose certificate does not chain to the trust bundle (another
// CA's, for the very ID of an allowed broker) does not get through the
// handshake.
func TestClientOfAnotherCA(t *testing.T) {
	a := startAgent(t, nil)
	otherCA, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := otherCA.Issue(localca.Leaf{PublicKey: key.Public(), Identity: brokerID, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	svid := &x509svid.SVID{ID: spiffeid.RequireFromString(brokerID.SPIFFEID), Certificates: leaf, PrivateKey: key}
	c, err := brokerclient.Dial(a.socket, svid, a.td, spiffeid.RequireFromString(agentID.SPIFFEID))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(callCtx(t), 10*time.Second)
	defer cancel()
	_, err = c.FirstSVID(ctx, brokerclient.PodRef("shop", "web-0", ""))
	if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
		t.Fatalf("a client of another CA: %v, want the connection refused", err)
	}
	if got := refused(t, a, "not_broker"); got != 0 {
		t.Fatalf("a call got through the handshake: %v refusals", got)
	}
}

// The JWT methods answer Unimplemented, saying why.
func TestJWTUnimplemented(t *testing.T) {
	a := startAgent(t, nil)
	c := a.client(t, brokerID)
	_, err := c.API.FetchJWTSVID(c.Context(callCtx(t)), &brokerpb.FetchJWTSVIDRequest{Reference: brokerclient.PodRef("shop", "web-0", ""), Audience: []string{"x"}})
	wantStatus(t, err, codes.Unimplemented, "", "no JWT signing authority")
	st, err := c.API.SubscribeToJWTBundles(c.Context(callCtx(t)), &brokerpb.SubscribeToJWTBundlesRequest{Reference: brokerclient.PodRef("shop", "web-0", "")})
	if err == nil {
		_, err = st.Recv()
	}
	wantStatus(t, err, codes.Unimplemented, "", "no JWT signing authority")
}

// A rotation is pushed on the open stream; the bundles stream answers with
// the trust domain's bundle.
func TestRotationPushed(t *testing.T) {
	a := startAgent(t, nil)
	c := a.client(t, brokerID)
	ctx := callCtx(t)
	st, err := c.SVIDs(ctx, brokerclient.PodRef("shop", "web-0", uidWeb))
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	bst, err := c.Bundles(ctx, brokerclient.PIDRef(int32(webPID)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := bst.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.GetBundles()["spiffe://cluster.local"]; !ok || len(b.GetBundles()) != 1 {
		t.Fatalf("bundles keyed %v, want spiffe://cluster.local", b.GetBundles())
	}
	for i := range 2 {
		testwait.Step(t, a.clock, 31*time.Minute) // past the renewal at half the hour
		next, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		s0, _, err := brokerclient.ParseSVID(first)
		if err != nil {
			t.Fatal(err)
		}
		s1, _, err := brokerclient.ParseSVID(next)
		if err != nil {
			t.Fatal(err)
		}
		if s0.Certificates[0].SerialNumber.Cmp(s1.Certificates[0].SerialNumber) == 0 {
			t.Fatalf("rotation %d: the same certificate again", i+1)
		}
		first = next
	}
}

// A stream ends with NotFound when its pod leaves the node.
func TestStreamEndsWhenPodLeaves(t *testing.T) {
	a := startAgent(t, nil)
	c := a.client(t, brokerID)
	st, err := c.SVIDs(callCtx(t), brokerclient.PIDRef(int32(webPID)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	a.pods.remove(uidWeb)
	a.srv.PodLeft(uidWeb, "was deleted")
	_, err = st.Recv()
	wantStatus(t, err, codes.NotFound, "", "was deleted")
	_, err = c.FirstSVID(callCtx(t), brokerclient.PodRef("", "", uidWeb))
	wantStatus(t, err, codes.NotFound, "WORKLOAD_NOT_FOUND", "no such pod")
}

// A stream by pid ends with NotFound when the process exits, even while
// its pod stays.
func TestStreamEndsWhenProcessExits(t *testing.T) {
	a := startAgent(t, nil)
	c := a.client(t, brokerID)
	child := exec.Command("sleep", "600")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	fakeProc(t, a.procRoot, child.Process.Pid, uidWeb)
	st, err := c.SVIDs(callCtx(t), brokerclient.PIDRef(int32(child.Process.Pid)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	_, err = st.Recv()
	wantStatus(t, err, codes.NotFound, "", "process has exited")
	if _, ok := a.pods.Get(uidWeb); !ok {
		t.Fatal("the pod left too")
	}
}

// A broker's streams and workloads are bounded; another broker is not
// affected by one at its limits.
func TestLimits(t *testing.T) {
	a := startAgent(t, func(c *brokerapi.Config) { c.MaxStreams = 2; c.MaxWorkloads = 1 })
	a.pods.m["6f1c2b3a-1111-4222-8333-aaaaaaaaaaaa"] = mkpod("shop", "web-1", "6f1c2b3a-1111-4222-8333-aaaaaaaaaaaa", "web", kubeclient.PodRunning)
	c := a.client(t, brokerID)
	ctx := callCtx(t)
	for range 2 {
		st, err := c.SVIDs(ctx, brokerclient.PodRef("shop", "web-0", ""))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.FirstSVID(ctx, brokerclient.PodRef("shop", "web-0", ""))
	wantStatus(t, err, codes.ResourceExhausted, "", "MESHAGENT_BROKER_MAX_STREAMS")
	other := a.client(t, pidOnlyID)
	if _, err := other.FirstSVID(ctx, brokerclient.PIDRef(int32(webPID))); err != nil {
		t.Fatalf("another broker: %v", err)
	}
	b := startAgent(t, func(c *brokerapi.Config) { c.MaxWorkloads = 1 })
	b.pods.m["6f1c2b3a-1111-4222-8333-aaaaaaaaaaaa"] = mkpod("shop", "web-1", "6f1c2b3a-1111-4222-8333-aaaaaaaaaaaa", "web", kubeclient.PodRunning)
	cb := b.client(t, brokerID)
	st, err := cb.SVIDs(ctx, brokerclient.PodRef("shop", "web-0", ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	_, err = cb.FirstSVID(ctx, brokerclient.PodRef("shop", "web-1", ""))
	wantStatus(t, err, codes.ResourceExhausted, "", "MESHAGENT_BROKER_MAX_WORKLOADS")
}

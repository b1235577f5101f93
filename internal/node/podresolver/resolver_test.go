package podresolver

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

const (
	uidA = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
	uidB = "ffffffff-0000-4000-8000-000000000001"
	cid  = "9f2d6c1e0b8a4f3e2d1c0b9a8f7e6d5c4b3a29180f7e6d5c4b3a291807f6e5d4"
)

var scheme, _ = pki.IstioScheme("cluster.local")

// sid is the identity of a SPIFFE ID.
func sid(s string) pki.Identity { return pki.Identity{SPIFFEID: s} }

// podMap is a fixed pod list for tests of the resolver's decisions on a
// fake /proc; the tests against the real API server use podindex.
type podMap map[string]podindex.Pod

func (m podMap) Get(uid string) (podindex.Pod, bool) {
	p, ok := m[uid]
	return p, ok
}

func (m podMap) Wait(ctx context.Context, uid string) (podindex.Pod, error) {
	if p, ok := m[uid]; ok {
		return p, nil
	}
	<-ctx.Done()
	return podindex.Pod{}, ctx.Err()
}

func pod(ns, name, uid, sa string, phase corev1.PodPhase) podindex.Pod {
	return podindex.Pod{
		Namespace: ns, Name: name, UID: uid, ServiceAccount: sa, Phase: kubeclient.PodPhase(phase),
		Identity: pki.SPIFFEIdentity("cluster.local", ns, sa),
	}
}

// statLine is a /proc/<pid>/stat line whose command name holds spaces and
// parentheses, with start time start.
func statLine(pid int, start uint64) string {
	f := []string{strconv.Itoa(pid), "(a) b (c)", "S"}
	for i := 4; i <= 52; i++ {
		v := "0"
		if i == 22 {
			v = strconv.FormatUint(start, 10)
		}
		f = append(f, v)
	}
	return strings.Join(f, " ") + "\n"
}

// fakeProc writes <root>/<pid>/{task/<pid>/stat,cgroup}. There is no
// <root>/<pid>/stat: the resolver reads the main thread's, whose cost does
// not grow with the process's threads.
func fakeProc(t *testing.T, root string, pid int, start uint64, cgroup string) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	task := filepath.Join(dir, "task", strconv.Itoa(pid))
	if err := os.MkdirAll(task, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(task, "stat"), []byte(statLine(pid, start)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResolveOnFakeProc(t *testing.T) {
	root := t.TempDir()
	v1 := func(path string) string { return "12:memory:/\n8:pids:" + path + "\n0::/\n" }
	fakeProc(t, root, 100, 5000, v1("/kubepods/besteffort/pod"+uidA+"/"+cid))
	fakeProc(t, root, 101, 5001, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+strings.ReplaceAll(uidB, "-", "_")+".slice/cri-containerd-"+cid+".scope\n")
	fakeProc(t, root, 102, 5002, v1("/system.slice/sshd.service"))
	fakeProc(t, root, 103, 5003, v1("/kubepods/besteffort/pod"+uidA+"\n7:memory:/kubepods/pod"+uidB))
	fakeProc(t, root, 104, 5004, v1("/kubepods/besteffort/pod11111111-2222-4333-8444-555555555555/"+cid))
	fakeProc(t, root, 105, 5005, v1("/kubepods/burstable/pod"+"aaaaaaaa-2222-4333-8444-555555555555"))
	fakeProc(t, root, 108, 5008, "0::/system.slice/docker-4f2c9a0b1d.scope\n")
	fakeProc(t, root, 109, 5009, "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-8a7b6c.scope\n")
	if err := os.WriteFile(filepath.Join(root, "106"), nil, 0o644); err != nil { // not a directory
		t.Fatal(err)
	}
	nodeID := sid("spiffe://cluster.local/ns/kube-system/sa/node-probe")
	pods := podMap{
		uidA:                                   pod("shop", "cart-0", uidA, "cart", corev1.PodPending),
		uidB:                                   pod("shop", "pay-0", uidB, "payments", corev1.PodRunning),
		"aaaaaaaa-2222-4333-8444-555555555555": pod("shop", "job-0", "aaaaaaaa-2222-4333-8444-555555555555", "batch", corev1.PodSucceeded),
	}
	reg := prometheus.NewPedanticRegistry()
	r, err := New(Config{Pods: pods, ProcRoot: root, PodWait: time.Millisecond, NodeUIDs: map[uint32]pki.Identity{0: nodeID}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		cred   caller.Cred
		want   caller.Info
		reason string
	}{
		{"cgroupfs pod", caller.Cred{UID: 1000, PID: 100}, caller.Info{Identity: sid("spiffe://cluster.local/ns/shop/sa/cart"), Pod: "shop/cart-0", PodUID: uidA}, ""},
		{"systemd pod", caller.Cred{UID: 1337, PID: 101}, caller.Info{Identity: sid("spiffe://cluster.local/ns/shop/sa/payments"), Pod: "shop/pay-0", PodUID: uidB}, ""},
		{"pod process running as root keeps its pod identity", caller.Cred{UID: 0, PID: 100}, caller.Info{Identity: sid("spiffe://cluster.local/ns/shop/sa/cart"), Pod: "shop/cart-0", PodUID: uidA}, ""},
		{"node process with a uid identity", caller.Cred{UID: 0, PID: 102}, caller.Info{Identity: nodeID}, ""},
		{"node process without", caller.Cred{UID: 1000, PID: 102}, caller.Info{}, ReasonNodeProcess},
		{"docker container with a node identity's uid", caller.Cred{UID: 0, PID: 108}, caller.Info{}, ReasonContainer},
		{"podman container with a node identity's uid", caller.Cred{UID: 0, PID: 109}, caller.Info{}, ReasonContainer},
		{"two pods in one cgroup file", caller.Cred{UID: 1000, PID: 103}, caller.Info{}, ReasonCgroup},
		{"pod not on this node", caller.Cred{UID: 1000, PID: 104}, caller.Info{}, ReasonPodUnknown},
		{"terminated pod", caller.Cred{UID: 1000, PID: 105}, caller.Info{}, ReasonPodTerminated},
		{"unreadable proc entry", caller.Cred{UID: 1000, PID: 106}, caller.Info{}, ReasonProcUnreadable},
		{"exited process", caller.Cred{UID: 1000, PID: 107}, caller.Info{}, ReasonProcessGone},
		{"no pid", caller.Cred{UID: 1000, PID: 0}, caller.Info{}, ReasonNoPID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.Resolve(context.Background(), tt.cred)
			if tt.reason != "" {
				wantRefusal(t, err, tt.reason)
				if strings.Contains(err.Error(), uidB) && tt.cred.PID != 101 {
					t.Errorf("refusal %q names another pod", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			tt.want.Cred = tt.cred
			if got != tt.want {
				t.Fatalf("Resolve = %+v, want %+v", got, tt.want)
			}
		})
	}
	if got := testutil.ToFloat64(r.metrics.refused.WithLabelValues(ReasonPodUnknown)); got != 1 {
		t.Errorf("refused{pod_unknown} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(r.metrics.resolved.WithLabelValues(kindPod)); got != 3 {
		t.Errorf("resolved{pod} = %v, want 3", got)
	}
	if got := testutil.ToFloat64(r.metrics.resolved.WithLabelValues(kindNode)); got != 1 {
		t.Errorf("resolved{node_uid} = %v, want 1", got)
	}
}

// TestResolveLinkerdIdentity: the caller gets its pod's identity as the
// index named it, a Linkerd DNS name as well as a SPIFFE ID.
func TestResolveLinkerdIdentity(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 100, 1, "0::/kubepods/pod"+uidA+"\n")
	p := pod("shop", "cart-0", uidA, "cart", corev1.PodRunning)
	p.Identity = pki.LinkerdIdentity("cluster.local", "shop", "cart", "linkerd")
	r, err := New(Config{Pods: podMap{uidA: p}, ProcRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	info, err := r.Resolve(context.Background(), caller.Cred{PID: 100})
	if err != nil || info.Identity.String() != "cart.shop.serviceaccount.identity.linkerd.cluster.local" {
		t.Fatalf("Resolve = %+v, %v", info, err)
	}
}

func TestResolveCanceledWhileWaiting(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 100, 1, "0::/kubepods/pod"+uidA+"\n")
	r, err := New(Config{Pods: podMap{}, ProcRoot: root, PodWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = r.Resolve(ctx, caller.Cred{PID: 100})
	wantRefusal(t, err, ReasonCanceled)
}

func wantRefusal(t *testing.T, err error, reason string) {
	t.Helper()
	var ref *Refusal
	if !errors.As(err, &ref) {
		t.Fatalf("Resolve error = %v, want a refusal (%s)", err, reason)
	}
	if ref.Reason != reason {
		t.Fatalf("refused for %s (%v), want %s", ref.Reason, err, reason)
	}
	if !strings.HasPrefix(err.Error(), "caller refused: ") {
		t.Fatalf("refusal %q does not say the caller is refused", err)
	}
}

// TestResolvePIDReusedDuringLookup: the process exits and its pid goes to a
// process of another pod between the reads: the start time differs and the
// caller gets nothing.
func TestResolvePIDReusedDuringLookup(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 200, 7000, "0::/kubepods/besteffort/pod"+uidA+"/"+cid+"\n")
	r, err := New(Config{Pods: podMap{uidA: pod("shop", "cart-0", uidA, "cart", corev1.PodRunning), uidB: pod("shop", "pay-0", uidB, "payments", corev1.PodRunning)}, ProcRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	r.afterCgroupRead = func() {
		fakeProc(t, root, 200, 7100, "0::/kubepods/besteffort/pod"+uidB+"/"+cid+"\n")
	}
	_, err = r.Resolve(context.Background(), caller.Cred{PID: 200})
	wantRefusal(t, err, ReasonPIDReused)

	// Exited during the lookup, pid not reused yet.
	fakeProc(t, root, 201, 7000, "0::/kubepods/besteffort/pod"+uidA+"/"+cid+"\n")
	r.afterCgroupRead = func() { os.RemoveAll(filepath.Join(root, "201")) }
	_, err = r.Resolve(context.Background(), caller.Cred{PID: 201})
	wantRefusal(t, err, ReasonProcessGone)
}

func TestResolveRefusesOversizedCgroupFile(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 300, 1, strings.Repeat("0::/\n", maxCgroupFile/5+1))
	r, err := New(Config{Pods: podMap{}, ProcRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Resolve(context.Background(), caller.Cred{PID: 300})
	wantRefusal(t, err, ReasonProcUnreadable)
}

func TestParseStartTime(t *testing.T) {
	got, err := parseStartTime([]byte(statLine(42, 123456789)))
	if err != nil || got != 123456789 {
		t.Fatalf("parseStartTime = %d, %v; want 123456789", got, err)
	}
	for _, bad := range []string{"", "42 (x S 1 2", "42 (x) S 1 2 3\n", strings.Replace(statLine(1, 1), " 1 0 0", " x 0 0", 1)} {
		if _, err := parseStartTime([]byte(bad)); err == nil {
			t.Errorf("parseStartTime(%q) succeeded", bad)
		}
	}
}

func FuzzParseStartTime(f *testing.F) {
	f.Add([]byte(statLine(1, 99)))
	f.Add([]byte("1 ()) ) 2 3"))
	f.Add([]byte("1 (a b) S" + strings.Repeat(" 7", 19) + "\t42\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := parseStartTime(data)
		// The kernel writes ASCII; there the fields are bytes.Fields'.
		if bytes.IndexFunc(data, func(r rune) bool { return r >= 0x80 }) >= 0 {
			return
		}
		end := bytes.LastIndexByte(data, ')')
		if end < 0 {
			if err == nil {
				t.Fatalf("parseStartTime(%q) = %d without a command name", data, got)
			}
			return
		}
		fields := bytes.Fields(data[end+1:])
		if len(fields) < 20 {
			if err == nil {
				t.Fatalf("parseStartTime(%q) = %d with %d fields", data, got, len(fields))
			}
			return
		}
		want, werr := strconv.ParseUint(string(fields[19]), 10, 64)
		if (err == nil) != (werr == nil) || got != want {
			t.Fatalf("parseStartTime(%q) = %d, %v; field 22 is %q", data, got, err, fields[19])
		}
	})
}

func TestAppendFile(t *testing.T) {
	dir := t.TempDir()
	big := strings.Repeat("1:name=systemd:/kubepods/besteffort/pod"+uidA+"/"+cid+"\n", 40) // larger than procBuffer
	name := filepath.Join(dir, "cgroup")
	if err := os.WriteFile(name, []byte(big), 0o600); err != nil {
		t.Fatal(err)
	}
	buf := append(make([]byte, 0, 8), "kept"...)
	got, err := appendFile(buf, name, len(big))
	if err != nil || string(got) != "kept"+big {
		t.Fatalf("appendFile = %d bytes, %v; want the file after the buffer's content", len(got), err)
	}
	if _, err := appendFile(nil, name, len(big)-1); err == nil {
		t.Fatal("a file one byte over the limit was read")
	}
	if _, err := appendFile(nil, filepath.Join(dir, "missing"), 10); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// Under caller.NoWait a pod not known yet is refused for now at once, and
// the refusal names the pod the cgroup names (caller.PodOf), so that the
// socket server counts the connection against that pod.
func TestResolveNoWaitNamesThePod(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 100, 1, "0::/kubepods/pod"+uidA+"\n")
	r, err := New(Config{Pods: podMap{}, ProcRoot: root, PodWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = r.Resolve(caller.NoWait(ctx), caller.Cred{PID: 100})
	wantRefusal(t, err, ReasonPodUnknown)
	if !caller.IsTemporary(err) || caller.PodOf(err) != uidA {
		t.Fatalf("refusal %v: temporary %v, pod %q; want temporary naming pod %s", err, caller.IsTemporary(err), caller.PodOf(err), uidA)
	}
	if ctx.Err() != nil {
		t.Fatal("Resolve waited for the pod under NoWait")
	}
}

// Group names the pod a process's cgroup names, with no pod lookup: a
// process in no pod is "" and told; one that has exited, or whose cgroup
// names two pods, cannot be told.
func TestGroup(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 300, 1, "0::/kubepods/besteffort/pod"+uidA+"/"+cid+"\n")
	fakeProc(t, root, 301, 1, "0::/system.slice/sshd.service\n")
	fakeProc(t, root, 302, 1, "8:pids:/kubepods/besteffort/pod"+uidA+"\n7:memory:/kubepods/pod"+uidB+"\n")
	r, err := New(Config{Pods: podMap{}, ProcRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pid  int32
		want string
		ok   bool
	}{{300, uidA, true}, {301, "", true}, {302, "", false}, {303, "", false}, {0, "", false}} {
		if got, ok := r.Group(caller.Cred{PID: c.pid}); got != c.want || ok != c.ok {
			t.Errorf("Group(pid %d) = %q, %v; want %q, %v", c.pid, got, ok, c.want, c.ok)
		}
	}
}

package podindex

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/kubeenv"
)

var scheme, _ = pki.IstioScheme("cluster.local")

// event is one handler call.
type event struct {
	added bool
	id    string
}

func (e event) String() string {
	if e.added {
		return "+" + e.id
	}
	return "-" + e.id
}

// recorder is an IdentityHandler that queues the calls it gets.
type recorder struct{ ch chan event }

func newRecorder() *recorder { return &recorder{ch: make(chan event, 1000)} }

func (r *recorder) IdentityAdded(id pki.Identity)   { r.ch <- event{true, id.String()} }
func (r *recorder) IdentityRemoved(id pki.Identity) { r.ch <- event{false, id.String()} }

// next returns the next event; it fails the test after a minute without one.
func (r *recorder) next(t *testing.T) event {
	t.Helper()
	select {
	case e := <-r.ch:
		return e
	case <-time.After(time.Minute):
		t.Fatal("no identity event within a minute")
		return event{}
	}
}

func (r *recorder) want(t *testing.T, want ...event) {
	t.Helper()
	for _, w := range want {
		if got := r.next(t); got != w {
			t.Fatalf("identity event %s, want %s", got, w)
		}
	}
}

func sa(ns, name string) string { return "spiffe://cluster.local/ns/" + ns + "/sa/" + name }

// fixture is a namespace with service accounts and a running index of
// node's pods.
type fixture struct {
	kube    *kubeenv.Env
	ns      string
	idx     *Index
	ev      *recorder
	left    chan string // "<namespace>/<name> <why>" of each PodLeft call
	arrived chan string // "<namespace>/<name>" of each PodArrived call
}

func newFixture(t *testing.T, node string, serviceAccounts ...string) *fixture {
	t.Helper()
	kube := kube.Env(t)
	ctx := context.Background()
	f := &fixture{kube: kube, ns: fmt.Sprintf("ns-%d", time.Now().UnixNano()), ev: newRecorder(), left: make(chan string, 1000),
		arrived: make(chan string, 1000)}
	if _, err := kube.CreateNamespace(ctx, f.ns); err != nil {
		t.Fatal(err)
	}
	// The index lists every pod of its node: the fixture's pods go with
	// it (at once: no kubelet confirms a graceful deletion), or the next
	// fixture on that node, -count=2's included, would see them.
	t.Cleanup(func() {
		_ = kube.Client().CoreV1().Pods(f.ns).DeleteCollection(context.Background(),
			metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}, metav1.ListOptions{})
	})
	for _, name := range serviceAccounts {
		if _, err := kube.CreateServiceAccount(ctx, f.ns, name); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := New(Config{Pods: podClient(t, kube), NodeName: node, Scheme: scheme, CSIDriver: csiDriver, Handler: f.ev,
		PodLeft: func(p Pod, why string) { f.left <- p.String() + " " + why },
		PodArrived: func(p Pod) {
			if _, ok := f.idx.Get(p.UID); !ok {
				p.Name += " (not in the index yet)"
			}
			f.arrived <- p.String()
		}})
	if err != nil {
		t.Fatal(err)
	}
	f.idx = idx
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- idx.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return f
}

func (f *fixture) pod(t *testing.T, name, serviceAccount, node string) *corev1.Pod {
	t.Helper()
	p, err := f.kube.CreatePod(context.Background(), f.ns, name, serviceAccount, node)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// seen waits until the index has the pod.
func (f *fixture) seen(t *testing.T, p *corev1.Pod) Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := f.idx.Wait(ctx, string(p.UID))
	if err != nil {
		t.Fatalf("pod %s never reached the index: %v", p.Name, err)
	}
	return got
}

func (f *fixture) delete(t *testing.T, p *corev1.Pod, grace int64) {
	t.Helper()
	err := f.kube.Client().CoreV1().Pods(f.ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(grace)})
	if err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) setPhase(t *testing.T, p *corev1.Pod, phase corev1.PodPhase) {
	t.Helper()
	cur, err := f.kube.Client().CoreV1().Pods(f.ns).Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.Phase = phase
	if _, err := f.kube.Client().CoreV1().Pods(f.ns).UpdateStatus(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestIdentityLifecycle: an identity arrives with its first pod on the node,
// stays while any of its pods runs (a pod being deleted still runs), and
// leaves when the last is deleted or terminates. Pods of other nodes are
// never seen. A pod of a fresh service account serves as a marker: when its
// event is next, nothing happened in between.
func TestIdentityLifecycle(t *testing.T) {
	f := newFixture(t, "node-a", "cart", "payments", "m1", "m2", "m3", "m4")
	cart0 := f.pod(t, "cart-0", "cart", "node-a")
	f.ev.want(t, event{true, sa(f.ns, "cart")})
	cart1 := f.pod(t, "cart-1", "cart", "node-a")
	far := f.pod(t, "pay-far", "payments", "node-b")
	f.pod(t, "marker-1", "m1", "node-a")
	f.ev.want(t, event{true, sa(f.ns, "m1")})
	f.seen(t, cart1)
	if _, ok := f.idx.Get(string(far.UID)); ok {
		t.Fatal("the index holds a pod of another node")
	}

	// Deleting with a grace period: the pod stays (no kubelet confirms), marked.
	f.delete(t, cart0, 30)
	f.pod(t, "marker-2", "m2", "node-a")
	f.ev.want(t, event{true, sa(f.ns, "m2")})
	if p, _ := f.idx.Get(string(cart0.UID)); !p.Deleting {
		t.Fatalf("pod being deleted: %+v, want Deleting", p)
	}
	// Gone for good; cart-1 still holds the identity.
	f.delete(t, cart0, 0)
	f.pod(t, "marker-3", "m3", "node-a")
	f.ev.want(t, event{true, sa(f.ns, "m3")})
	if _, ok := f.idx.Get(string(cart0.UID)); ok {
		t.Fatal("deleted pod still in the index")
	}
	// The last cart pod terminates: the identity leaves; the pod stays known.
	f.setPhase(t, cart1, corev1.PodSucceeded)
	f.ev.want(t, event{false, sa(f.ns, "cart")})
	if p, ok := f.idx.Get(string(cart1.UID)); !ok || !p.Terminated() {
		t.Fatalf("terminated pod: %+v, %v", p, ok)
	}
	// A pod of the same service account comes back.
	f.pod(t, "cart-2", "cart", "node-a")
	f.ev.want(t, event{true, sa(f.ns, "cart")})
	f.pod(t, "marker-4", "m4", "node-a")
	f.ev.want(t, event{true, sa(f.ns, "m4")})

	ids := f.idx.Identities()
	if got := ids[pki.Identity{SPIFFEID: sa(f.ns, "cart")}]; len(got) != 1 || got[0] != f.ns+"/cart-2" {
		t.Fatalf("pods of cart: %v, want [%s/cart-2]", got, f.ns)
	}
	if _, ok := ids[pki.Identity{SPIFFEID: sa(f.ns, "payments")}]; ok {
		t.Fatal("payments listed: its only pod is on another node")
	}
}

// TestPodLeft: PodLeft is told once of a pod deleted (not while it is only
// being deleted, with a grace period), Succeeded or Failed, and of nothing
// else; PodArrived once of each pod, once Get finds it.
func TestPodLeft(t *testing.T) {
	node := fmt.Sprintf("node-left-%d", time.Now().UnixNano())
	f := newFixture(t, node, "app")
	done := f.pod(t, "done", "app", node)
	failed := f.pod(t, "failed", "app", node)
	gone := f.pod(t, "gone", "app", node)
	for _, p := range []*corev1.Pod{done, failed, gone} {
		f.seen(t, p)
	}
	next := func(want string) {
		t.Helper()
		select {
		case got := <-f.left:
			if got != f.ns+"/"+want {
				t.Fatalf("PodLeft %q, want %q", got, f.ns+"/"+want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("PodLeft not told %q within a minute", want)
		}
	}
	// Each pod arrived once, found by Get by then; the updates below are
	// no arrivals.
	arrivals := map[string]bool{}
	for range 3 {
		arrivals[<-f.arrived] = true
	}
	for _, name := range []string{"done", "failed", "gone"} {
		if !arrivals[f.ns+"/"+name] {
			t.Fatalf("PodArrived told %v, want %s once each", arrivals, name)
		}
	}
	f.setPhase(t, done, corev1.PodSucceeded)
	next("done has finished (Succeeded)")
	f.setPhase(t, failed, corev1.PodFailed)
	next("failed has finished (Failed)")
	f.delete(t, gone, 30) // being deleted: still running
	f.delete(t, gone, 0)
	next("gone was deleted")
	f.delete(t, done, 0)
	next("done was deleted")
	select {
	case got := <-f.left:
		t.Fatalf("PodLeft told more: %q", got)
	case got := <-f.arrived:
		t.Fatalf("PodArrived told more: %q", got)
	default:
	}
}

// TestManyPodsFewIdentities: 200 pods of 20 service accounts on the node
// (and 40 on another node) make 20 arrivals; deleting them all makes 20
// departures.
func TestManyPodsFewIdentities(t *testing.T) {
	const accounts, perAccount = 20, 10
	names := make([]string, accounts)
	for i := range names {
		names[i] = fmt.Sprintf("sa-%02d", i)
	}
	f := newFixture(t, "node-many", append(names, "marker")...)
	ctx := context.Background()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		pods []*corev1.Pod
		errs []error
	)
	sem := make(chan struct{}, 8)
	for i := range accounts * perAccount {
		for _, node := range []string{"node-many", "node-other"} {
			if node == "node-other" && i%5 != 0 {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				p, err := f.kube.CreatePod(ctx, f.ns, fmt.Sprintf("p-%s-%03d", node, i), names[i%accounts], node)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				} else if node == "node-many" {
					pods = append(pods, p)
				}
			}()
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("creating pods: %v (and %d more)", errs[0], len(errs)-1)
	}
	got := map[string]bool{}
	for range accounts {
		e := f.ev.next(t)
		if !e.added || got[e.id] {
			t.Fatalf("identity event %s after %v", e, got)
		}
		got[e.id] = true
	}
	f.pod(t, "marker", "marker", "node-many")
	f.ev.want(t, event{true, sa(f.ns, "marker")})
	for _, p := range pods {
		f.seen(t, p)
	}
	ids := f.idx.Identities()
	if len(ids) != accounts+1 {
		t.Fatalf("%d identities, want %d", len(ids), accounts+1)
	}
	for _, name := range names {
		if n := len(ids[pki.Identity{SPIFFEID: sa(f.ns, name)}]); n != perAccount {
			t.Fatalf("%s has %d pods, want %d", name, n, perAccount)
		}
	}

	err := f.kube.Client().CoreV1().Pods(f.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
		metav1.ListOptions{FieldSelector: "spec.nodeName=node-many"})
	if err != nil {
		t.Fatal(err)
	}
	gone := map[string]bool{}
	for range accounts + 1 {
		e := f.ev.next(t)
		if e.added || gone[e.id] {
			t.Fatalf("identity event %s after %v", e, gone)
		}
		gone[e.id] = true
	}
	if ids := f.idx.Identities(); len(ids) != 0 {
		t.Fatalf("identities left after every pod is gone: %v", ids)
	}
	select {
	case e := <-f.ev.ch:
		t.Fatalf("extra identity event %s", e)
	default:
	}
}

// TestStoredPodsAreStripped: the informer keeps only the fields read.
func TestStoredPodsAreStripped(t *testing.T) {
	f := newFixture(t, "node-strip", "app")
	p := f.pod(t, "app-0", "app", "node-strip")
	f.seen(t, p)
	objs := f.idx.informer.GetStore().List()
	if len(objs) != 1 {
		t.Fatalf("%d pods stored, want 1", len(objs))
	}
	stored := objs[0].(*kubeclient.Pod)
	if len(stored.Labels) != 0 || len(stored.ManagedFields) != 0 {
		t.Fatalf("stored pod keeps unread fields: %+v", stored)
	}
	if stored.UID != p.UID || stored.Spec.ServiceAccountName != "app" || stored.Spec.NodeName != "node-strip" || stored.Status.Phase != kubeclient.PodPending {
		t.Fatalf("stored pod lost a field it needs: %+v", stored)
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	idx, err := New(Config{Pods: clientOfNothing(t), NodeName: "n", Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := idx.Wait(ctx, "00000000-0000-4000-8000-000000000000"); err != context.Canceled {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
}

func TestNewRequires(t *testing.T) {
	pods := clientOfNothing(t)
	for _, cfg := range []Config{
		{NodeName: "n", Scheme: scheme},
		{Pods: pods, Scheme: scheme},
		{Pods: pods, NodeName: "n"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

// clientOfNothing is a client whose server does not exist, for tests that
// must not reach one.
func clientOfNothing(t *testing.T) *kubeclient.Client {
	t.Helper()
	client, err := kubeclient.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// TestSurvivesAPIServerRestart: the watch breaks when the API server
// restarts; the index reconnects and keeps following the node's pods.
func TestSurvivesAPIServerRestart(t *testing.T) {
	f := newFixture(t, "node-restart", "before", "after")
	p := f.pod(t, "before-0", "before", "node-restart")
	f.ev.want(t, event{true, sa(f.ns, "before")})
	if err := f.kube.Restart(context.Background()); err != nil {
		t.Fatalf("restarting the API server: %v", err)
	}
	f.delete(t, p, 0)
	f.pod(t, "after-0", "after", "node-restart")
	f.ev.want(t, event{false, sa(f.ns, "before")}, event{true, sa(f.ns, "after")})
}

// TestPodsOf: a service account's pods on the node, those not being deleted
// first; pods of other accounts, other nodes and terminated pods are left
// out.
func TestPodsOf(t *testing.T) {
	f := newFixture(t, "node-a", "web", "db")
	w0 := f.pod(t, "web-0", "web", "node-a")
	f.pod(t, "web-1", "web", "node-a")
	w2 := f.pod(t, "web-2", "web", "node-a")
	f.pod(t, "web-far", "web", "node-b")
	db := f.pod(t, "db-0", "db", "node-a")
	f.delete(t, w0, 30)
	f.setPhase(t, w2, corev1.PodFailed)
	f.seen(t, db)
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		p0, _ := f.idx.Get(string(w0.UID))
		p2, _ := f.idx.Get(string(w2.UID))
		return p0.Deleting && p2.Terminated(), nil
	})
	if err != nil {
		t.Fatalf("the index never saw web-0 deleted and web-2 failed: %v", err)
	}
	var names []string
	for _, p := range f.idx.PodsOf(f.ns, "web") {
		names = append(names, p.Name)
	}
	if got := strings.Join(names, ","); got != "web-1,web-0" {
		t.Fatalf("PodsOf(web) = %s, want web-1,web-0", got)
	}
	if got := f.idx.PodsOf(f.ns, "none"); len(got) != 0 {
		t.Fatalf("PodsOf(none) = %v, want none", got)
	}
}

// podClient is the agent's client, as the API server's admin.
func podClient(t *testing.T, kube *kubeenv.Env) *kubeclient.Client {
	t.Helper()
	client, err := kubeclient.NewForConfig(kube.Config())
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// annotate sets the prefetch annotation of a pod to value.
func (f *fixture) annotate(t *testing.T, p *corev1.Pod, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, PrefetchAnnotation, value)
	if _, err := f.kube.Client().CoreV1().Pods(f.ns).Patch(context.Background(), p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// Only pods that ask for it (meshagent.io/prefetch: "true") make their
// identity fetched ahead; a terminated one does not count, and the stored
// pod keeps that annotation alone.
func TestPrefetchOnlyForPodsThatAsk(t *testing.T) {
	f := newFixture(t, "node-pf", "web", "db", "job")
	web := f.pod(t, "web-0", "web", "node-pf")
	f.pod(t, "web-1", "web", "node-pf")
	db := f.pod(t, "db-0", "db", "node-pf")
	job := f.pod(t, "job-0", "job", "node-pf")
	f.annotate(t, web, "true")
	f.annotate(t, db, "false")
	f.annotate(t, job, "true")
	f.setPhase(t, job, corev1.PodSucceeded)
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		w, _ := f.idx.Get(string(web.UID))
		j, _ := f.idx.Get(string(job.UID))
		d, ok := f.idx.Get(string(db.UID))
		return w.Prefetch && j.Prefetch && j.Terminated() && ok && !d.Prefetch, nil
	})
	if err != nil {
		t.Fatalf("the index never saw the annotations: %v", err)
	}
	id := func(name string) pki.Identity { return pki.Identity{SPIFFEID: sa(f.ns, name)} }
	for name, want := range map[string]bool{"web": true, "db": false, "job": false, "none": false} {
		if got := f.idx.Prefetch(id(name)); got != want {
			t.Errorf("Prefetch(%s) = %v, want %v", name, got, want)
		}
	}
	for _, obj := range f.idx.informer.GetStore().List() {
		if p := obj.(*kubeclient.Pod); p.Name == "web-0" && (len(p.Annotations) != 1 || p.Annotations[PrefetchAnnotation] != "true") {
			t.Errorf("stored web-0 annotations %v, want the prefetch one alone", p.Annotations)
		}
	}
}

// csiDriver is the node agent's CSI driver in the fixture's index.
const csiDriver = "csi.meshagent.io"

// csiPod creates a pod on node with an inline volume of driver.
func (f *fixture) csiPod(t *testing.T, name, serviceAccount, node, driver string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			ServiceAccountName: serviceAccount,
			NodeName:           node,
			Containers: []corev1.Container{{Name: "app", Image: kubeenv.PodImage,
				VolumeMounts: []corev1.VolumeMount{{Name: "socket", MountPath: "/run/socket"}}}},
			Volumes: []corev1.Volume{
				{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "socket", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: driver, ReadOnly: ptr.To(true)}}},
			},
		},
	}
	p, err := f.kube.Client().CoreV1().Pods(f.ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A pod that mounts the node agent's CSI volume asks for its certificate
// ahead without any annotation (the volume is the agent's socket: the pod
// will ask); "false" says no even then; another driver's volume does not
// ask. The stored pod keeps the agent's volume alone, by its driver.
func TestPrefetchForPodsOfTheCSIVolume(t *testing.T) {
	f := newFixture(t, "node-csi", "web", "db", "cache")
	web := f.csiPod(t, "web-0", "web", "node-csi", csiDriver)
	db := f.csiPod(t, "db-0", "db", "node-csi", csiDriver)
	f.annotate(t, db, "false")
	cache := f.csiPod(t, "cache-0", "cache", "node-csi", "csi.other.example")
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, w := f.idx.Get(string(web.UID))
		_, c := f.idx.Get(string(cache.UID))
		d, ok := f.idx.Get(string(db.UID))
		return w && c && ok && !d.Prefetch, nil
	})
	if err != nil {
		t.Fatalf("the index never saw the pods and db-0's annotation: %v", err)
	}
	id := func(name string) pki.Identity { return pki.Identity{SPIFFEID: sa(f.ns, name)} }
	for name, want := range map[string]bool{"web": true, "db": false, "cache": false} {
		if got := f.idx.Prefetch(id(name)); got != want {
			t.Errorf("Prefetch(%s) = %v, want %v", name, got, want)
		}
	}
	for _, obj := range f.idx.informer.GetStore().List() {
		p := obj.(*kubeclient.Pod)
		switch v := p.Spec.Volumes; p.Name {
		case "web-0", "db-0":
			if len(v) != 1 || v[0].CSI == nil || v[0].CSI.Driver != csiDriver || v[0].Name != "" {
				t.Errorf("stored %s volumes %+v, want the agent's CSI volume alone, by its driver", p.Name, v)
			}
		case "cache-0":
			if len(v) != 0 {
				t.Errorf("stored cache-0 volumes %+v, want none", v)
			}
		}
	}
}

// ByName finds a pod of the node by namespace and name; a pod of another
// node or of another name is not found.
func TestByName(t *testing.T) {
	f := newFixture(t, "node-a", "web")
	w0 := f.pod(t, "web-0", "web", "node-a")
	f.pod(t, "web-far", "web", "node-b")
	f.seen(t, w0)
	got, ok := f.idx.ByName(f.ns, "web-0")
	if !ok || got.UID != string(w0.UID) {
		t.Fatalf("ByName(web-0) = %v, %v; want pod %s", got, ok, w0.UID)
	}
	for _, name := range []string{"web-far", "web-1"} {
		if got, ok := f.idx.ByName(f.ns, name); ok {
			t.Fatalf("ByName(%s) = %v, want none", name, got)
		}
	}
	if got, ok := f.idx.ByName("other", "web-0"); ok {
		t.Fatalf("ByName(other/web-0) = %v, want none", got)
	}
}

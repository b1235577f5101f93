package podindex

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
)

// Pod is what the index keeps of a pod.
type Pod struct {
	Namespace, Name, UID string
	// ServiceAccount is the pod's service account ("default" when the pod
	// names none).
	ServiceAccount string
	NodeName       string
	Phase          kubeclient.PodPhase
	// Deleting is true once the pod has a deletion timestamp.
	Deleting bool
	// Prefetch is true when the pod asks for its certificate ahead of its
	// first request: it mounts a volume of Config.CSIDriver (the node
	// agent's socket), or is annotated meshagent.io/prefetch: "true"; the
	// annotation "false" says no whatever it mounts.
	Prefetch bool
	// Identity is the identity Config.Scheme gives the pod's namespace and
	// service account.
	Identity pki.Identity
}

// PrefetchAnnotation, set to "true" on a pod, asks the node agent to fetch
// the certificate of the pod's identity as soon as the pod is on the node,
// instead of at its first request; "false" asks it not to, even for a pod
// that mounts the agent's CSI volume.
const PrefetchAnnotation = "meshagent.io/prefetch"

// Terminated reports whether the pod's phase is Succeeded or Failed: none of
// its containers runs any more.
func (p Pod) Terminated() bool {
	return p.Phase == kubeclient.PodSucceeded || p.Phase == kubeclient.PodFailed
}

// String is "<namespace>/<name>".
func (p Pod) String() string { return p.Namespace + "/" + p.Name }

// IdentityHandler is told when an identity gains its first pod on the node
// and when it loses its last one.
type IdentityHandler interface {
	IdentityAdded(id pki.Identity)
	IdentityRemoved(id pki.Identity)
}

// HandlerFuncs adapts two functions to an IdentityHandler; a nil function is
// not called.
type HandlerFuncs struct {
	Added, Removed func(id pki.Identity)
}

// IdentityAdded calls Added.
func (h HandlerFuncs) IdentityAdded(id pki.Identity) {
	if h.Added != nil {
		h.Added(id)
	}
}

// IdentityRemoved calls Removed.
func (h HandlerFuncs) IdentityRemoved(id pki.Identity) {
	if h.Removed != nil {
		h.Removed(id)
	}
}

// Config configures an Index.
type Config struct {
	// Pods lists and watches pods (a *kubeclient.Client). Required.
	Pods PodSource
	// NodeName is the node whose pods are kept. Required.
	NodeName string
	// Scheme names the pods' identities. Required.
	Scheme pki.Scheme
	// CSIDriver is the CSI driver of the node agent's socket volume
	// (csi.meshagent.io): a pod with an inline volume of it asks for its
	// certificate ahead (Pod.Prefetch). Empty: only the annotation asks.
	CSIDriver string
	// Handler is told of identities arriving and leaving; nil means nobody.
	Handler IdentityHandler
	// PodLeft, when set, is told of a pod that left: deleted, or finished
	// (Succeeded, Failed); why says which ("was deleted", "has finished
	// (Succeeded)"). Node mode ends the pod's connections with it.
	PodLeft func(p Pod, why string)
	// PodArrived, when set, is told of a pod the index did not hold before
	// (added, or listed at start), after Get and Wait find it. Node mode
	// resolves again the connections its processes opened before.
	PodArrived func(p Pod)
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
	// Registerer receives the index's metrics; nil means none.
	Registerer prometheus.Registerer
}

// PodSource lists and watches the pods that match a field selector, for an
// informer of *kubeclient.Pod. *kubeclient.Client implements it.
type PodSource interface {
	PodListWatch(fieldSelector string) cache.ListerWatcher
}

// Index is the set of pods on one node, by UID.
type Index struct {
	cfg      Config
	log      *zap.Logger
	informer cache.SharedIndexInformer
	metrics  *metrics

	// listErr is the informer's last list or watch failure (listError);
	// nil once a list succeeded.
	listErr atomic.Pointer[error]

	mu      sync.Mutex
	pods    map[string]Pod       // by UID
	refs    map[pki.Identity]int // counted pods per identity
	changed chan struct{}        // closed and replaced when a pod is added or updated
}

// New returns an Index of cfg.NodeName's pods. It starts nothing.
func New(cfg Config) (*Index, error) {
	if cfg.Pods == nil {
		return nil, errors.New("podindex: Pods is required")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("podindex: NodeName is required")
	}
	if cfg.Scheme.IsZero() {
		return nil, errors.New("podindex: Scheme is required")
	}
	if cfg.Handler == nil {
		cfg.Handler = HandlerFuncs{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	x := &Index{
		cfg:     cfg,
		log:     cfg.Logger.Named("podindex").With(zap.String(logkeys.Node, cfg.NodeName)),
		metrics: m,
		pods:    map[string]Pod{},
		refs:    map[pki.Identity]int{},
		changed: make(chan struct{}),
	}
	selector := fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	lw := x.noted(cfg.Pods.PodListWatch(selector))
	x.informer = cache.NewSharedIndexInformerWithOptions(lw, &kubeclient.Pod{}, cache.SharedIndexInformerOptions{})
	if err := x.informer.SetTransform(x.strip); err != nil {
		return nil, fmt.Errorf("podindex: setting the pod transform: %w", err)
	}
	if _, err := x.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { x.upsert(obj) },
		UpdateFunc: func(_, obj any) { x.upsert(obj) },
		DeleteFunc: x.delete,
	}); err != nil {
		return nil, fmt.Errorf("podindex: adding the event handler: %w", err)
	}
	return x, nil
}

// noted wraps lw so that every list and watch call's failure is kept for
// ListError and logged once per change of its text: the informer retries
// with backoff and, in its watch-list mode, says nothing of an API server
// it cannot reach.
func (x *Index) noted(lw cache.ListerWatcher) cache.ListerWatcher {
	inner := cache.ToListerWatcherWithContext(lw)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			obj, err := inner.ListWithContext(ctx, opts)
			x.note(ctx, err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w, err := inner.WatchWithContext(ctx, opts)
			x.note(ctx, err)
			return w, err
		},
	}
}

// note records the outcome of a call to the API server.
func (x *Index) note(ctx context.Context, err error) {
	if err == nil {
		if prev := x.listErr.Swap(nil); prev != nil {
			x.log.Info("the API server answers again")
		}
		return
	}
	if ctx.Err() != nil {
		return // stopping
	}
	// The request's URL changes with every retry (its timeout): keep the
	// server and the cause, so that the same failure reads the same.
	var ue *url.Error
	if errors.As(err, &ue) {
		host := ue.URL
		if u, perr := url.Parse(ue.URL); perr == nil {
			host = u.Scheme + "://" + u.Host
		}
		err = fmt.Errorf("API server %s: %w", host, ue.Err)
	}
	prev := x.listErr.Swap(&err)
	if prev == nil || (*prev).Error() != err.Error() {
		x.log.Warn("cannot list or watch the node's pods; retrying", zap.Error(err))
	}
}

// ListError returns the last failure to list or watch the node's pods
// while the first list is not read yet; nil once it is.
func (x *Index) ListError() error {
	if x.informer.HasSynced() {
		return nil
	}
	if p := x.listErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Run runs the informer until ctx ends; it returns nil then. Run once.
func (x *Index) Run(ctx context.Context) error {
	x.log.Info("watching the node's pods")
	x.informer.RunWithContext(ctx)
	return nil
}

// HasSynced reports whether the first list of pods has been read.
func (x *Index) HasSynced() bool { return x.informer.HasSynced() }

// Get returns the pod with uid, if it is on the node.
func (x *Index) Get(uid string) (Pod, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	p, ok := x.pods[uid]
	return p, ok
}

// ByName returns the pod namespace/name, if it is on the node. While a pod
// is replaced by another of the same name (a StatefulSet's), both may be
// listed: the one that is neither finished nor being deleted is returned,
// else either. It looks at every pod of the node (a few hundred at most).
func (x *Index) ByName(namespace, name string) (Pod, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var found Pod
	ok := false
	for _, p := range x.pods {
		if p.Namespace != namespace || p.Name != name {
			continue
		}
		if !ok || (!p.Terminated() && !p.Deleting) {
			found, ok = p, true
		}
	}
	return found, ok
}

// Wait returns the pod with uid, waiting until the informer sees it or ctx
// ends (then it returns ctx's error).
func (x *Index) Wait(ctx context.Context, uid string) (Pod, error) {
	for {
		x.mu.Lock()
		p, ok := x.pods[uid]
		changed := x.changed
		x.mu.Unlock()
		if ok {
			return p, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return Pod{}, ctx.Err()
		}
	}
}

// Identities returns each identity with counted pods, and those pods
// ("<namespace>/<name>", sorted).
func (x *Index) Identities() map[pki.Identity][]string {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make(map[pki.Identity][]string, len(x.refs))
	for _, p := range x.pods {
		if counted(p) {
			out[p.Identity] = append(out[p.Identity], p.String())
		}
	}
	for _, pods := range out {
		sort.Strings(pods)
	}
	return out
}

func counted(p Pod) bool { return !p.Terminated() }

// upsert records an added or updated pod and tells the handler of an
// identity that gains its first pod or loses its last.
func (x *Index) upsert(obj any) {
	k8sPod, ok := obj.(*kubeclient.Pod)
	if !ok {
		return
	}
	p, err := x.podOf(k8sPod)
	if err != nil {
		x.log.Warn("pod ignored", zap.String(logkeys.Pod, k8sPod.Namespace+"/"+k8sPod.Name), zap.Error(err))
		return
	}
	var added, removed []pki.Identity
	x.mu.Lock()
	old, had := x.pods[p.UID]
	x.pods[p.UID] = p
	if had && counted(old) {
		removed = x.unref(old.Identity, removed)
	}
	if counted(p) {
		added = x.ref(p.Identity, added)
	}
	// A pod whose identity did not change is removed and added back: cancel
	// the pair so the handler sees nothing.
	added, removed = cancel(added, removed)
	close(x.changed)
	x.changed = make(chan struct{})
	x.setGauges()
	x.mu.Unlock()
	x.emit(added, removed)
	if !had && x.cfg.PodArrived != nil {
		x.cfg.PodArrived(p)
	}
	if p.Terminated() && (!had || !old.Terminated()) {
		x.left(p, "has finished ("+string(p.Phase)+")")
	}
}

// left tells PodLeft of a pod that left.
func (x *Index) left(p Pod, why string) {
	if x.cfg.PodLeft != nil {
		x.cfg.PodLeft(p, why)
	}
}

func (x *Index) delete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	k8sPod, ok := obj.(*kubeclient.Pod)
	if !ok {
		return
	}
	var removed []pki.Identity
	x.mu.Lock()
	old, had := x.pods[string(k8sPod.UID)]
	if had {
		delete(x.pods, old.UID)
		if counted(old) {
			removed = x.unref(old.Identity, removed)
		}
	}
	x.setGauges()
	x.mu.Unlock()
	x.emit(nil, removed)
	if had {
		x.left(old, "was deleted")
	}
}

// ref and unref adjust an identity's count and append it to events when it
// crosses zero. x.mu must be held.
func (x *Index) ref(id pki.Identity, events []pki.Identity) []pki.Identity {
	x.refs[id]++
	if x.refs[id] == 1 {
		events = append(events, id)
	}
	return events
}

func (x *Index) unref(id pki.Identity, events []pki.Identity) []pki.Identity {
	x.refs[id]--
	if x.refs[id] <= 0 {
		delete(x.refs, id)
		events = append(events, id)
	}
	return events
}

func cancel(added, removed []pki.Identity) ([]pki.Identity, []pki.Identity) {
	if len(added) == 1 && len(removed) == 1 && added[0] == removed[0] {
		return nil, nil
	}
	return added, removed
}

func (x *Index) setGauges() {
	x.metrics.pods.Set(float64(len(x.pods)))
	x.metrics.identities.Set(float64(len(x.refs)))
}

// emit tells the handler, removals first. It runs on the informer's event
// goroutine, without x.mu.
func (x *Index) emit(added, removed []pki.Identity) {
	for _, id := range removed {
		x.log.Info("identity left the node", zap.Stringer(logkeys.Identity, id))
		x.cfg.Handler.IdentityRemoved(id)
	}
	for _, id := range added {
		x.log.Info("identity arrived on the node", zap.Stringer(logkeys.Identity, id))
		x.cfg.Handler.IdentityAdded(id)
	}
}

func (x *Index) podOf(p *kubeclient.Pod) (Pod, error) {
	sa := p.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	id, err := x.cfg.Scheme.Identity(p.Namespace, sa)
	if err != nil {
		return Pod{}, fmt.Errorf("naming its identity: %w", err)
	}
	return Pod{
		Namespace:      p.Namespace,
		Name:           p.Name,
		UID:            string(p.UID),
		ServiceAccount: sa,
		NodeName:       p.Spec.NodeName,
		Phase:          p.Status.Phase,
		Deleting:       p.DeletionTimestamp != nil,
		Prefetch:       x.prefetch(p),
		Identity:       id,
	}, nil
}

// prefetch reports whether a pod asks for its certificate ahead: its
// annotation says so, or it says nothing and mounts the agent's CSI volume.
func (x *Index) prefetch(p *kubeclient.Pod) bool {
	switch p.Annotations[PrefetchAnnotation] {
	case "true":
		return true
	case "false":
		return false
	}
	return x.mountsCSI(p)
}

// mountsCSI reports whether p has an inline volume of Config.CSIDriver.
func (x *Index) mountsCSI(p *kubeclient.Pod) bool {
	if x.cfg.CSIDriver == "" {
		return false
	}
	for _, v := range p.Spec.Volumes {
		if v.CSI != nil && v.CSI.Driver == x.cfg.CSIDriver {
			return true
		}
	}
	return false
}

// strip keeps only the fields the index reads, so the informer's store holds
// a few hundred bytes per pod instead of the whole object: of the volumes,
// the first of Config.CSIDriver, if any, by its driver alone.
func (x *Index) strip(obj any) (any, error) {
	p, ok := obj.(*kubeclient.Pod)
	if !ok {
		return obj, nil
	}
	var annotations map[string]string
	if v, ok := p.Annotations[PrefetchAnnotation]; ok {
		annotations = map[string]string{PrefetchAnnotation: v}
	}
	var volumes []kubeclient.Volume
	if x.mountsCSI(p) {
		volumes = []kubeclient.Volume{{CSI: &kubeclient.CSIVolumeSource{Driver: x.cfg.CSIDriver}}}
	}
	return &kubeclient.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Annotations:       annotations,
			Name:              p.Name,
			Namespace:         p.Namespace,
			UID:               p.UID,
			ResourceVersion:   p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec: kubeclient.PodSpec{
			ServiceAccountName: p.Spec.ServiceAccountName,
			NodeName:           p.Spec.NodeName,
			Volumes:            volumes,
		},
		Status: kubeclient.PodStatus{Phase: p.Status.Phase},
	}, nil
}

// Prefetch reports whether a counted pod of id on the node asks for its
// certificate ahead (Pod.Prefetch).
func (x *Index) Prefetch(id pki.Identity) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range x.pods {
		if p.Identity == id && p.Prefetch && counted(p) {
			return true
		}
	}
	return false
}

// PodsOf returns the counted pods of namespace/serviceAccount on the node:
// pods not being deleted first, then by name. Node mode binds a service
// account's CA tokens to one of them.
func (x *Index) PodsOf(namespace, serviceAccount string) []Pod {
	x.mu.Lock()
	var out []Pod
	for _, p := range x.pods {
		if p.Namespace == namespace && p.ServiceAccount == serviceAccount && counted(p) {
			out = append(out, p)
		}
	}
	x.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Deleting != out[j].Deleting {
			return !out[i].Deleting
		}
		return out[i].Name < out[j].Name
	})
	return out
}

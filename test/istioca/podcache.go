package istioca

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// podSyncTimeout bounds the wait for the pod informer's first list.
const podSyncTimeout = 30 * time.Second

// indexOnNode indexes the pods that count for impersonation: not failed,
// bound to a node, by that node and their service account.
const indexOnNode = "node-serviceaccount"

// podCache is the node authorizer's view of the cluster's pods, as istiod's:
// an informer on every pod, by namespace/name and by node and service
// account. The informer's store is safe for concurrent use; informer,
// cancel and done are set once by startPodCache; mu guards the rest.
type podCache struct {
	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
	done     chan struct{} // closed when the informer has stopped

	mu      sync.Mutex
	lastErr error         // the informer's last list or watch failure, for the sync timeout
	changed chan struct{} // closed and replaced after every pod event reached the store
}

// startPodCache runs a pod informer on kube and waits for its first list.
func startPodCache(kube kubernetes.Interface) (*podCache, error) {
	pods := kube.CoreV1().Pods(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return pods.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(lw, &corev1.Pod{}, cache.SharedIndexInformerOptions{
		Indexers: cache.Indexers{indexOnNode: nodeIndexKeys},
	})
	if err := inf.SetTransform(stripPod); err != nil {
		return nil, fmt.Errorf("setting the pod transform: %w", err)
	}
	c := &podCache{informer: inf, done: make(chan struct{}), changed: make(chan struct{})}
	// Handlers run after the event is in the store and its indexes.
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.notify() },
		UpdateFunc: func(any, any) { c.notify() },
		DeleteFunc: func(any) { c.notify() },
	}); err != nil {
		return nil, fmt.Errorf("adding the pod event handler: %w", err)
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		c.mu.Lock()
		c.lastErr = err
		c.mu.Unlock()
	}); err != nil {
		return nil, fmt.Errorf("setting the pod watch error handler: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		inf.RunWithContext(ctx)
	}()
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, podSyncTimeout, true, func(context.Context) (bool, error) {
		return inf.HasSynced(), nil
	})
	if err != nil {
		c.stop()
		c.mu.Lock()
		defer c.mu.Unlock()
		return nil, fmt.Errorf("pod informer not synced after %v (last error: %v)", podSyncTimeout, c.lastErr)
	}
	return c, nil
}

// stop ends the informer and waits for it. It is safe to call more than once.
func (c *podCache) stop() {
	c.cancel()
	<-c.done
}

func (c *podCache) notify() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.changed)
	c.changed = make(chan struct{})
}

// await waits until found holds, checking after every pod event, for at
// most d or until ctx ends; it reports whether found held.
func (c *podCache) await(ctx context.Context, d time.Duration, found func() bool) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		c.mu.Lock()
		changed := c.changed
		c.mu.Unlock()
		if found() {
			return true
		}
		select {
		case <-changed:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// pod is the cached pod ns/name, or nil.
func (c *podCache) pod(ns, name string) *corev1.Pod {
	obj, ok, err := c.informer.GetStore().GetByKey(ns + "/" + name)
	if err != nil || !ok {
		return nil
	}
	return obj.(*corev1.Pod)
}

// onNode reports whether the cache holds a pod of ns/sa on node that has
// not failed.
func (c *podCache) onNode(node, ns, sa string) bool {
	objs, err := c.informer.GetIndexer().ByIndex(indexOnNode, nodeKey(node, ns, sa))
	return err == nil && len(objs) > 0
}

func nodeKey(node, ns, sa string) string { return node + "/" + ns + "/" + sa }

// nodeIndexKeys is the index function of indexOnNode.
func nodeIndexKeys(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.NodeName == "" || p.Spec.ServiceAccountName == "" || p.Status.Phase == corev1.PodFailed {
		return nil, nil
	}
	return []string{nodeKey(p.Spec.NodeName, p.Namespace, p.Spec.ServiceAccountName)}, nil
}

// stripPod keeps what the node authorizer reads (and the resource version
// the informer resumes from), so thousands of pods cost little.
func stripPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName, ServiceAccountName: p.Spec.ServiceAccountName},
		Status:     corev1.PodStatus{Phase: p.Status.Phase},
	}, nil
}

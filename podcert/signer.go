package podcert

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/meshagent/meshagent/internal/backoff"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/logkeys"
)

// Signer signs the PodCertificateRequests of one node for one signer name.
// It publishes nothing: the signer's ClusterTrustBundle is the Publisher's,
// which runs once per cluster. Create it with New; Run does the work.
type Signer struct {
	cfg      Config
	log      *zap.Logger
	metrics  *metrics
	informer cache.SharedIndexInformer
	backoff  backoff.Policy

	mu sync.Mutex
	// attempts counts the failed CA requests of each request, by key.
	attempts map[string]int
	// backdate is how far the CA was last seen to move NotBefore back.
	backdate time.Duration
	// podsSynced is when Run saw the pod index's first full list: PodWait
	// counts from then at the earliest.
	podsSynced time.Time
}

// New checks cfg, fills in defaults and returns a Signer. It starts nothing.
func New(cfg Config) (*Signer, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Signer{
		cfg:      cfg,
		log:      cfg.Logger.Named("podcert").With(zap.String(logkeys.Signer, cfg.SignerName)),
		metrics:  m,
		backoff:  backoff.Policy{Base: cfg.BackoffBase, Cap: cfg.BackoffCap},
		attempts: map[string]int{},
		backdate: cfg.CABackdate,
	}
	s.informer = cache.NewSharedIndexInformerWithOptions(
		cfg.API.PodCertificateRequestListWatch("spec.nodeName="+cfg.NodeName),
		&kubeclient.PodCertificateRequest{},
		cache.SharedIndexInformerOptions{},
	)
	if err := s.informer.SetTransform(stripManagedFields); err != nil {
		return nil, fmt.Errorf("podcert: %w", err)
	}
	return s, nil
}

// stripManagedFields drops what the signer never reads from the cached
// requests.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// HasSynced reports whether the node's requests and pods have been listed
// once: Run starts signing only then.
func (s *Signer) HasSynced() bool { return s.informer.HasSynced() && s.cfg.Pods.HasSynced() }

// Run watches the node's requests and signs those for the signer, with
// Workers workers, until ctx ends (then it returns nil once every worker has stopped).
func (s *Signer) Run(ctx context.Context) error {
	queue := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{
		Name:  "podcert",
		Clock: s.cfg.Clock,
	})
	reg, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.enqueue(queue, obj) },
		UpdateFunc: func(_, obj any) { s.enqueue(queue, obj) },
		DeleteFunc: func(obj any) { s.deleted(obj) },
	})
	if err != nil {
		queue.ShutDown()
		return fmt.Errorf("podcert: %w", err)
	}
	defer func() { _ = s.informer.RemoveEventHandler(reg) }()

	var wg sync.WaitGroup
	defer wg.Wait()
	defer queue.ShutDown()
	wg.Go(func() { s.informer.RunWithContext(ctx) })
	// No worker before both lists are in: a request listed before its pod
	// would otherwise be judged against an index still filling.
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced, s.cfg.Pods.HasSynced) {
		return nil // ctx ended
	}
	s.mu.Lock()
	s.podsSynced = s.cfg.Clock.Now()
	s.mu.Unlock()
	s.log.Info("signing pod certificate requests", zap.String(logkeys.Node, s.cfg.NodeName), zap.Int(logkeys.Workers, s.cfg.Workers))
	for range s.cfg.Workers {
		wg.Go(func() { s.work(ctx, queue) })
	}
	<-ctx.Done()
	return nil
}

// enqueue queues a request of the signer that awaits an answer.
func (s *Signer) enqueue(q workqueue.TypedDelayingInterface[string], obj any) {
	req, ok := obj.(*kubeclient.PodCertificateRequest)
	if !ok || req.Spec.SignerName != s.cfg.SignerName || answered(req) {
		return
	}
	key, err := cache.MetaNamespaceKeyFunc(req)
	if err != nil {
		return
	}
	q.Add(key)
}

// deleted forgets a deleted request's attempts.
func (s *Signer) deleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
		s.forget(key)
	}
}

func (s *Signer) forget(key string) {
	s.mu.Lock()
	delete(s.attempts, key)
	s.mu.Unlock()
}

// work answers queued requests until the queue shuts down.
func (s *Signer) work(ctx context.Context, q workqueue.TypedDelayingInterface[string]) {
	for {
		key, shutdown := q.Get()
		if shutdown {
			return
		}
		if retry, again := s.process(ctx, key); again {
			q.AddAfter(key, retry)
		}
		q.Done(key)
	}
}

// answered reports whether req carries a terminal condition (Issued,
// Denied or Failed): the API server allows no further status change.
func answered(req *kubeclient.PodCertificateRequest) bool {
	for _, c := range req.Status.Conditions {
		switch c.Type {
		case kubeclient.PodCertificateRequestIssued,
			kubeclient.PodCertificateRequestDenied,
			kubeclient.PodCertificateRequestFailed:
			return true
		}
	}
	return false
}

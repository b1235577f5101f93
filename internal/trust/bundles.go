package trust

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
)

// ClusterTrustBundleWatcher lists and watches ClusterTrustBundles.
// *kubeclient.Certificates is one.
type ClusterTrustBundleWatcher interface {
	ClusterTrustBundleListWatch(fieldSelector string) cache.ListerWatcher
}

// ClusterTrustBundleConfig configures a ClusterTrustBundleSource.
type ClusterTrustBundleConfig struct {
	// Kube reads the bundles. Required.
	Kube ClusterTrustBundleWatcher
	// Signer is the signer name whose bundles are followed
	// (spec.signerName). Required.
	Signer string
	// Sink receives the union of the signer's bundles at every change.
	// Required.
	Sink Sink
	// Logger is narrowed with .Named("trust"). Nil means zap.NewNop().
	Logger *zap.Logger
}

// ClusterTrustBundleSource follows every ClusterTrustBundle of one signer
// (certificates.k8s.io/v1) into a Sink, as the union of their roots: during
// a rotation the signer publishes the new root in a bundle of its own
// beside the old one, then deletes the old one. A bundle that does not
// parse is refused alone; the others are merged. When no good bundle of the
// signer is left, the signer's last good roots stay.
type ClusterTrustBundleSource struct {
	name     string
	sink     Sink
	log      *zap.Logger
	informer cache.SharedIndexInformer

	mu      sync.Mutex        // serialises recomputations
	refused map[string]string // bundle name -> resourceVersion last refused (logged once)
}

// NewClusterTrustBundleSource checks cfg and returns the source. It starts
// nothing.
func NewClusterTrustBundleSource(cfg ClusterTrustBundleConfig) (*ClusterTrustBundleSource, error) {
	if cfg.Kube == nil || cfg.Sink == nil || cfg.Signer == "" {
		return nil, errors.New("trust: a ClusterTrustBundle source needs a client, a sink and a signer name")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	s := &ClusterTrustBundleSource{
		name:    "clustertrustbundle:" + cfg.Signer,
		sink:    cfg.Sink,
		refused: map[string]string{},
	}
	s.log = cfg.Logger.Named("trust").With(zap.String(logkeys.Source, s.name))
	lw := cfg.Kube.ClusterTrustBundleListWatch(fields.OneTermEqualSelector("spec.signerName", cfg.Signer).String())
	s.informer = cache.NewSharedIndexInformerWithOptions(lw, &kubeclient.ClusterTrustBundle{}, cache.SharedIndexInformerOptions{})
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.recompute() },
		UpdateFunc: func(any, any) { s.recompute() },
		DeleteFunc: func(any) { s.recompute() },
	}); err != nil {
		return nil, fmt.Errorf("trust: adding the ClusterTrustBundle event handler: %w", err)
	}
	return s, nil
}

// Name is the source's name: clustertrustbundle:<signer>.
func (s *ClusterTrustBundleSource) Name() string { return s.name }

// Run lists and watches the signer's bundles until ctx ends, and returns
// nil. The informer retries a failed list or watch with backoff. Run once.
func (s *ClusterTrustBundleSource) Run(ctx context.Context) error {
	s.log.Info("watching the signer's ClusterTrustBundles")
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
			s.recompute() // says so when the signer has no bundle yet
		}
	})
	s.informer.RunWithContext(ctx)
	return nil
}

// HasSynced reports whether the first list has been read.
func (s *ClusterTrustBundleSource) HasSynced() bool { return s.informer.HasSynced() }

// recompute merges the signer's bundles now in the informer's store, in
// name order, and hands the union to the sink.
func (s *ClusterTrustBundleSource) recompute() {
	s.mu.Lock()
	defer s.mu.Unlock()
	objs := s.informer.GetStore().List()
	bundles := make([]*kubeclient.ClusterTrustBundle, 0, len(objs))
	for _, o := range objs {
		if b, ok := o.(*kubeclient.ClusterTrustBundle); ok {
			bundles = append(bundles, b)
		}
	}
	sort.Slice(bundles, func(i, j int) bool { return bundles[i].Name < bundles[j].Name })
	var (
		good []byte
		used []string
		seen = make(map[string]bool, len(bundles))
	)
	for _, b := range bundles {
		seen[b.Name] = true
		if _, err := pki.ParseCertificates([]byte(b.Spec.TrustBundle)); err != nil {
			if s.refused[b.Name] != b.ResourceVersion {
				s.refused[b.Name] = b.ResourceVersion
				s.sink.Refuse(s.name, fmt.Errorf("ClusterTrustBundle %s: %w", b.Name, err))
			}
			continue
		}
		delete(s.refused, b.Name)
		good = append(good, b.Spec.TrustBundle...)
		good = append(good, '\n')
		used = append(used, b.Name)
	}
	for name := range s.refused {
		if !seen[name] {
			delete(s.refused, name) // deleted while bad
		}
	}
	if len(used) == 0 {
		s.sink.Refuse(s.name, fmt.Errorf("no usable ClusterTrustBundle of the signer: %w", ErrMissing))
		return
	}
	s.log.Debug("signer's bundles", zap.Strings(logkeys.Bundles, used))
	_ = s.sink.Update(s.name, good) // the merger de-duplicates; a refusal is logged and counted there
}

package trust

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/logkeys"
)

// ConfigMapWatcher lists and watches ConfigMaps. *kubeclient.Client is one.
type ConfigMapWatcher interface {
	ConfigMapListWatch(namespace, fieldSelector string) cache.ListerWatcher
}

// ConfigMapConfig configures a ConfigMapSource.
type ConfigMapConfig struct {
	// Kube reads the ConfigMap. Required.
	Kube ConfigMapWatcher
	// Namespace, Name and Key name the bundle: a PEM bundle in the key's
	// data (or binaryData). All required.
	Namespace, Name, Key string
	// Sink receives the bundle at every change. Required.
	Sink Sink
	// Logger is narrowed with .Named("trust"). Nil means zap.NewNop().
	Logger *zap.Logger
}

// ConfigMapSource follows one key of one ConfigMap (istiod's
// istio-ca-root-cert/root-cert.pem, Linkerd's
// linkerd-identity-trust-roots/ca-bundle.crt) into a Sink. A ConfigMap that
// is missing, lacks the key or holds no good bundle is refused: the key's
// last good roots stay in the merge.
type ConfigMapSource struct {
	name     string
	key      string
	sink     Sink
	log      *zap.Logger
	informer cache.SharedIndexInformer
}

// NewConfigMapSource checks cfg and returns the source. It starts nothing.
func NewConfigMapSource(cfg ConfigMapConfig) (*ConfigMapSource, error) {
	if cfg.Kube == nil || cfg.Sink == nil || cfg.Namespace == "" || cfg.Name == "" || cfg.Key == "" {
		return nil, errors.New("trust: a ConfigMap source needs a client, a sink, a namespace, a name and a key")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	s := &ConfigMapSource{
		name: "configmap:" + cfg.Namespace + "/" + cfg.Name + "/" + cfg.Key,
		key:  cfg.Key,
		sink: cfg.Sink,
	}
	s.log = cfg.Logger.Named("trust").With(zap.String(logkeys.Source, s.name))
	lw := cfg.Kube.ConfigMapListWatch(cfg.Namespace, fields.OneTermEqualSelector("metadata.name", cfg.Name).String())
	s.informer = cache.NewSharedIndexInformerWithOptions(lw, &kubeclient.ConfigMap{}, cache.SharedIndexInformerOptions{})
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.apply(obj) },
		UpdateFunc: func(_, obj any) { s.apply(obj) },
		DeleteFunc: func(any) {
			s.refuse(fmt.Errorf("the ConfigMap was deleted: %w", ErrMissing))
		},
	}); err != nil {
		return nil, fmt.Errorf("trust: adding the ConfigMap event handler: %w", err)
	}
	return s, nil
}

// Name is the source's name in logs, metrics and the merged bundle's
// description: configmap:<namespace>/<name>/<key>.
func (s *ConfigMapSource) Name() string { return s.name }

// Run lists and watches the ConfigMap until ctx ends, and returns nil. The
// informer retries a failed list or watch with backoff; nothing the API
// server answers stops it. Run once.
func (s *ConfigMapSource) Run(ctx context.Context) error {
	s.log.Info("watching the trust bundle ConfigMap")
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) && len(s.informer.GetStore().ListKeys()) == 0 {
			s.refuse(fmt.Errorf("the ConfigMap does not exist (yet): %w", ErrMissing))
		}
	})
	s.informer.RunWithContext(ctx)
	return nil
}

// HasSynced reports whether the first list has been read.
func (s *ConfigMapSource) HasSynced() bool { return s.informer.HasSynced() }

func (s *ConfigMapSource) apply(obj any) {
	cm, ok := obj.(*kubeclient.ConfigMap)
	if !ok {
		return
	}
	var data []byte
	if text, ok := cm.Data[s.key]; ok {
		data = []byte(text)
	} else if bin, ok := cm.BinaryData[s.key]; ok {
		data = bin
	} else {
		s.refuse(fmt.Errorf("the ConfigMap has no key %q: %w", s.key, ErrMissing))
		return
	}
	_ = s.sink.Update(s.name, data) // a refusal is logged and counted by the sink
}

func (s *ConfigMapSource) refuse(err error) { s.sink.Refuse(s.name, err) }

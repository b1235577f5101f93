package podcert

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/backoff"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/promreg"
)

// BundleLabel is set on the ClusterTrustBundle the publisher writes. Pods
// select the bundle by its name (BundleName), never by label: any holder of
// attest on the signer could label a bundle of its own.
const BundleLabel = "meshagent.io/trust-bundle"

// BundleAPI is the part of the Kubernetes API the publisher uses
// (kubeclient.Certificates): the one bundle, by name.
type BundleAPI interface {
	GetClusterTrustBundle(ctx context.Context, name string) (*kubeclient.ClusterTrustBundle, error)
	CreateClusterTrustBundle(ctx context.Context, b *kubeclient.ClusterTrustBundle) (*kubeclient.ClusterTrustBundle, error)
	UpdateClusterTrustBundle(ctx context.Context, b *kubeclient.ClusterTrustBundle) (*kubeclient.ClusterTrustBundle, error)
}

// PublisherConfig describes a Publisher. Zero values get the defaults noted.
type PublisherConfig struct {
	// SignerName is the signer whose bundle is published. Required.
	SignerName string
	// API reads and writes the bundle. Required.
	API BundleAPI
	// Roots is the mesh's trust bundle, published as it changes. Required.
	Roots RootSource
	// BundleResync is how often the bundle is checked even when the roots
	// did not change (someone else may have changed it). Default 10m.
	BundleResync time.Duration
	// BackoffBase and BackoffCap: the wait after a failed write doubles,
	// with jitter. Zero means backoff.Default's.
	BackoffBase, BackoffCap time.Duration
	// Clock times the resync and backoff. Default the real clock.
	Clock clock.WithTicker
	// Rand returns uniform numbers in [0, 1) for the jitter. Default
	// math/rand/v2.Float64.
	Rand func() float64
	// Logger receives the publisher's logs. Nil means no logs.
	Logger *zap.Logger
	// Registerer receives meshagent_podcert_trust_bundle_writes_total. Nil
	// means it is not registered.
	Registerer prometheus.Registerer
}

// Publisher keeps the signer's ClusterTrustBundle (BundleName) equal to the
// mesh's roots. One publisher per cluster holds the rights to write it (the
// chart's trust-publisher Deployment: attest on the signer, the bundle by
// name); node agents only sign (docs/pod-certificates.md). Create it with
// NewPublisher; Run does the work.
type Publisher struct {
	cfg     PublisherConfig
	name    string
	log     *zap.Logger
	backoff backoff.Policy
	writes  *prometheus.CounterVec
}

// NewPublisher checks cfg, fills in defaults and returns a Publisher. It
// starts nothing.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.SignerName == "" || cfg.API == nil || cfg.Roots == nil {
		return nil, fmt.Errorf("podcert: PublisherConfig needs SignerName, API and Roots")
	}
	if err := ValidateSignerName(cfg.SignerName); err != nil {
		return nil, err
	}
	if cfg.BundleResync <= 0 {
		cfg.BundleResync = DefaultBundleResync
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = backoff.Default.Base
	}
	if cfg.BackoffCap <= 0 {
		cfg.BackoffCap = backoff.Default.Cap
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	p := &Publisher{
		cfg:     cfg,
		name:    BundleName(cfg.SignerName),
		log:     cfg.Logger.Named("trust_publisher").With(zap.String(logkeys.Signer, cfg.SignerName)),
		backoff: backoff.Policy{Base: cfg.BackoffBase, Cap: cfg.BackoffCap},
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshagent_podcert_trust_bundle_writes_total",
			Help: "Writes of the signer's ClusterTrustBundle, by result (success, error).",
		}, []string{"result"}),
	}
	if err := promreg.Assign(cfg.Registerer, &p.writes); err != nil {
		return nil, fmt.Errorf("registering trust publisher metrics: %w", err)
	}
	return p, nil
}

// Run publishes the roots at start, after every root change, every
// BundleResync, and after a failed write with backoff, until ctx ends; it
// then returns nil.
func (p *Publisher) Run(ctx context.Context) error {
	changed, stop := p.cfg.Roots.Watch()
	defer stop()
	failures := 0
	for {
		wait := p.cfg.BundleResync
		if err := p.ensure(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			wait = p.backoff.Delay(failures, p.cfg.Rand())
			failures++
			p.writes.WithLabelValues(resultError).Inc()
			p.log.Warn("cannot publish the trust bundle", zap.String(logkeys.Bundle, p.name),
				zap.Duration(logkeys.RetryIn, wait), zap.Error(err))
		} else {
			failures = 0
		}
		t := p.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-changed:
		case <-t.C():
		}
		t.Stop()
	}
}

// ensure creates or updates the ClusterTrustBundle when it differs from the
// current roots.
func (p *Publisher) ensure(ctx context.Context) error {
	roots, _ := p.cfg.Roots.Bundle()
	want := string(roots.PEM())
	cur, err := p.cfg.API.GetClusterTrustBundle(ctx, p.name)
	switch {
	case apierrors.IsNotFound(err):
		_, err = p.cfg.API.CreateClusterTrustBundle(ctx, &kubeclient.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: map[string]string{BundleLabel: "mesh-roots"}},
			Spec:       kubeclient.ClusterTrustBundleSpec{SignerName: p.cfg.SignerName, TrustBundle: want},
		})
		if err != nil {
			return fmt.Errorf("creating ClusterTrustBundle %s: %w", p.name, err)
		}
	case err != nil:
		return fmt.Errorf("reading ClusterTrustBundle %s: %w", p.name, err)
	case cur.Spec.TrustBundle == want && cur.Spec.SignerName == p.cfg.SignerName:
		return nil
	default:
		cur.Spec.TrustBundle = want
		if _, err := p.cfg.API.UpdateClusterTrustBundle(ctx, cur); err != nil {
			return fmt.Errorf("updating ClusterTrustBundle %s: %w", p.name, err)
		}
	}
	p.writes.WithLabelValues(resultSuccess).Inc()
	p.log.Info("trust bundle published", zap.String(logkeys.Bundle, p.name), zap.Int(logkeys.Roots, len(roots.Certs())))
	return nil
}

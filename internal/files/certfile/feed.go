package certfile

import (
	"context"
	"fmt"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
)

// RootFeedConfig configures a RootFeed.
type RootFeedConfig struct {
	// Name says which setting the bundle comes from (for errors and logs:
	// "ca_root", "xds_root"). Optional.
	Name string
	// Path is the root bundle: a PEM file, or SystemRoots. Required.
	Path string
	// Source configures the watch (debounce, clock, logger, metrics).
	Source SourceConfig
}

// RootFeed follows a root bundle file into a secret.Roots: the trust
// bundle the secret manager serves as ROOTCA and a CA client verifies its
// server with.
type RootFeed struct {
	path  string
	src   *Source[*pki.Bundle]
	roots *secret.Roots
	log   *zap.Logger
}

// NewRootFeed reads the bundle now (a bundle that cannot be read is an
// error) and returns the feed, whose Roots hold it. It starts nothing.
func NewRootFeed(cfg RootFeedConfig) (*RootFeed, error) {
	src, err := LoadRootSource(cfg.Source, cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", cfg.Name, cfg.Path, err)
	}
	b, _, _ := src.Current()
	return &RootFeed{path: cfg.Path, src: src, roots: secret.RootsOf(b, cfg.Path), log: logger(cfg.Source).With(zap.String(logkeys.Path, cfg.Path))}, nil
}

// Roots returns the bundle the feed keeps current.
func (f *RootFeed) Roots() *secret.Roots { return f.roots }

// Run watches the file and sets every new good bundle, as parsed, into
// Roots until ctx ends, and returns nil. It may be called once.
func (f *RootFeed) Run(ctx context.Context) error {
	return follow(ctx, f.src, func(b *pki.Bundle) { f.roots.SetBundle(b, f.path) })
}

// Publisher takes the own workload certificate from files
// (secretmanager.Manager.Publish).
type Publisher interface {
	Publish(*secret.Secret) error
}

// PairFeedConfig configures a PairFeed.
type PairFeedConfig struct {
	// CertPath and KeyPath are the certificate chain and key files. Required.
	CertPath, KeyPath string
	// Label is the Secret.Source of what is published ("workload-credentials",
	// "file-mounted").
	Label string
	// Into receives every new good pair as the workload certificate. Required.
	Into Publisher
	// Source configures the watch (debounce, clock, logger, metrics).
	Source SourceConfig
}

// PairFeed follows a certificate chain and key file pair into a Publisher:
// workload credentials and file-mounted certificates served as the workload
// certificate.
type PairFeed struct {
	label string
	src   *Source[*Pair]
	into  Publisher
	log   *zap.Logger
}

// NewPairFeed checks cfg and returns the feed. It does no I/O: files that
// are missing now are published once they appear.
func NewPairFeed(cfg PairFeedConfig) (*PairFeed, error) {
	if cfg.Into == nil {
		return nil, fmt.Errorf("certfile: pair feed %s: no publisher", cfg.Label)
	}
	src, err := NewPairSource(cfg.Source, cfg.CertPath, cfg.KeyPath)
	if err != nil {
		return nil, err
	}
	return &PairFeed{label: cfg.Label, src: src, into: cfg.Into, log: logger(cfg.Source).With(zap.String(logkeys.Source, src.Name()))}, nil
}

// Run watches the files and publishes every new good pair until ctx ends,
// and returns nil. A pair the publisher refuses is logged; it may be called
// once.
func (f *PairFeed) Run(ctx context.Context) error {
	return follow(ctx, f.src, func(p *Pair) {
		if err := f.into.Publish(p.Secret(secret.WorkloadCertName, f.label)); err != nil {
			f.log.Warn("certificate files not served", zap.Error(err))
		}
	})
}

// follow runs src and hands its values to fn until ctx ends.
func follow[T Value[T]](ctx context.Context, src *Source[T], fn func(T)) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return src.Run(ctx) })
	g.Go(func() error {
		src.Follow(ctx, fn)
		return nil
	})
	return g.Wait()
}

func logger(cfg SourceConfig) *zap.Logger {
	if cfg.Logger == nil {
		return zap.NewNop()
	}
	return cfg.Logger.Named("certfile")
}

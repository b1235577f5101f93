package app

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/podcert"
)

// TrustPublisherConfig describes `meshagent trust-publisher`: the one
// component of a cluster that publishes the mesh's roots as the Pod
// Certificates signer's ClusterTrustBundle (docs/pod-certificates.md).
type TrustPublisherConfig struct {
	// Signer is the signer name (MESHAGENT_POD_CERTIFICATE_SIGNER of the
	// node agents). Required.
	Signer string
	// Roots is the PEM file of the mesh's roots, followed as it changes
	// (the node agents' CA_ROOT_CA). Required.
	Roots string
	// Kubeconfig is the API server's configuration; empty means in-cluster.
	Kubeconfig string
	// Version goes into the API client's user agent.
	Version string
	// Logger receives the logs. Nil means none.
	Logger *zap.Logger
}

// RunTrustPublisher reads the roots (a file that cannot be read is an error
// at once), then follows the file and keeps the signer's ClusterTrustBundle
// equal to it until ctx ends; it then returns nil.
func RunTrustPublisher(ctx context.Context, cfg TrustPublisherConfig) error {
	if cfg.Signer == "" || cfg.Roots == "" {
		return configError(errors.New("trust-publisher needs --signer and --roots"))
	}
	if err := podcert.ValidateSignerName(cfg.Signer); err != nil {
		return configError(err)
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	feed, err := certfile.NewRootFeed(certfile.RootFeedConfig{Name: "roots", Path: cfg.Roots, Source: certfile.SourceConfig{Logger: log}})
	if err != nil {
		return configError(err)
	}
	rc, err := kubeclient.RESTConfig(kubeclient.Config{Kubeconfig: cfg.Kubeconfig, UserAgent: "meshagent-trust-publisher/" + cfg.Version})
	if err != nil {
		return configError(fmt.Errorf("trust-publisher: %w", err))
	}
	api, err := kubeclient.NewCertificates(rc)
	if err != nil {
		return err
	}
	p, err := podcert.NewPublisher(podcert.PublisherConfig{SignerName: cfg.Signer, API: api, Roots: feed.Roots(), Logger: log})
	if err != nil {
		return configError(err)
	}
	log.Info("publishing the mesh roots", zap.String(logkeys.Signer, cfg.Signer), zap.String(logkeys.Bundle, podcert.BundleName(cfg.Signer)))
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return feed.Run(ctx) })
	g.Go(func() error { return p.Run(ctx) })
	return g.Wait()
}

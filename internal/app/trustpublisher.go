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
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/podcert"
)

// TrustPublisherConfig describes `meshagent trust-publisher`: the one
// component of a cluster that publishes the mesh's roots as the Pod
// Certificates signer's ClusterTrustBundle (docs/pod-certificates.md).
type TrustPublisherConfig struct {
	// Settings are the resolved settings; the publisher reads
	// MESHAGENT_POD_CERTIFICATE_SIGNER (the signer, as the node agents'),
	// CA_ROOT_CA (the PEM file of the mesh's roots, followed as it changes)
	// and KUBECONFIG. Required.
	Settings *settings.Config
	// Version goes into the API client's user agent.
	Version string
	// Logger receives the logs. Nil means none.
	Logger *zap.Logger
}

// RunTrustPublisher reads the roots (a file that cannot be read is an error
// at once), then follows the file and keeps the signer's ClusterTrustBundle
// equal to it until ctx ends; it then returns nil.
func RunTrustPublisher(ctx context.Context, cfg TrustPublisherConfig) error {
	if cfg.Settings == nil {
		return configError(errors.New("trust-publisher: no settings"))
	}
	s := cfg.Settings
	if s.PodCertificateSigner == "" {
		return configError(errors.New("trust-publisher needs the signer: set --signer or MESHAGENT_POD_CERTIFICATE_SIGNER"))
	}
	if s.CARoot == "" {
		return configError(errors.New("trust-publisher needs the mesh roots: set --roots or CA_ROOT_CA"))
	}
	if err := podcert.ValidateSignerName(s.PodCertificateSigner); err != nil {
		return configError(fmt.Errorf("MESHAGENT_POD_CERTIFICATE_SIGNER=%s: %w", s.PodCertificateSigner, err))
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	feed, err := certfile.NewRootFeed(certfile.RootFeedConfig{Name: "roots", Path: s.CARoot, Source: certfile.SourceConfig{Debounce: s.FileDebounce, Logger: log}})
	if err != nil {
		return configError(settingError(err, fileSettings))
	}
	rc, err := kubeclient.RESTConfig(kubeclient.Config{Kubeconfig: s.Kubeconfig, UserAgent: "meshagent-trust-publisher/" + cfg.Version})
	if err != nil {
		return configError(fmt.Errorf("trust-publisher: %w", err))
	}
	api, err := kubeclient.NewCertificates(rc)
	if err != nil {
		return err
	}
	p, err := podcert.NewPublisher(podcert.PublisherConfig{SignerName: s.PodCertificateSigner, API: api, Roots: feed.Roots(), Logger: log})
	if err != nil {
		return configError(err)
	}
	log.Info("publishing the mesh roots", zap.String(logkeys.Signer, s.PodCertificateSigner), zap.String(logkeys.Bundle, podcert.BundleName(s.PodCertificateSigner)))
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return feed.Run(ctx) })
	g.Go(func() error { return p.Run(ctx) })
	return g.Wait()
}

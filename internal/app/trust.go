package app

import (
	"errors"
	"fmt"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/trust"
	"github.com/meshagent/meshagent/secretmanager"
)

// trustRoots returns the roots a certificate source serves and verifies
// with (docs/trust.md): the root files' roots as they are when no cluster
// trust source is set; else a bundle of its own that holds the union of
// the files and the ConfigMap key, the ClusterTrustBundles and istiod's
// ProxyConfig the settings name, with the components that keep it live.
// The ProxyConfig source (PROXY_CONFIG_XDS_AGENT) is returned for the xDS
// proxy, which feeds it. Every user of the roots
// (ROOTCA, the Workload API, OUTPUT_CERTS, the CA and xDS connections) then
// follows the union.
//
// The CRL file (MESHAGENT_CRL_FILE), when set, is followed into the roots
// returned, and served with them in ROOTCA.
func (a *App) trustRoots(fileRoots *secretmanager.Roots) (trustSet, error) {
	ts, err := a.clusterTrust(fileRoots)
	if err != nil || a.s.CRLFile == "" {
		return ts, err
	}
	feed, err := trust.NewCRLFeed(trust.CRLFeedConfig{Path: a.s.CRLFile, Into: ts.roots, Source: a.fileConfig()})
	if err != nil {
		return trustSet{}, err
	}
	ts.components = append(ts.components, component{name: "crl_watcher", run: feed.Run})
	return ts, nil
}

// trustSet is what trustRoots builds.
type trustSet struct {
	// roots are the mesh's roots.
	roots *secretmanager.Roots
	// components keep them live.
	components []component
	// proxyConfig takes the roots from istiod's ProxyConfig
	// (PROXY_CONFIG_XDS_AGENT); the xDS proxy feeds it. Nil when off.
	proxyConfig *trust.ProxyConfigSource
}

// clusterTrust is trustRoots without the CRL.
func (a *App) clusterTrust(fileRoots *secretmanager.Roots) (trustSet, error) {
	c := a.s
	fromXDS := c.ProxyConfigXDSAgent && c.XDSProxy && c.Mode != settings.ModeNode
	if c.TrustConfigMap.IsZero() && c.TrustBundleSigner == "" && !fromXDS {
		return trustSet{roots: fileRoots}, nil
	}
	first, source := fileRoots.Bundle()
	merged := secret.RootsOf(first, source)
	merger, err := trust.NewMerger(trust.MergerConfig{Publisher: merged, Logger: a.base, Metrics: trust.NewMetrics(a.reg)})
	if err != nil {
		return trustSet{}, err
	}
	fromFiles := trust.Follow("file:"+source, fileRoots, merger)
	// The files come first in the merge, as they are now.
	if err := merger.UpdateBundle(fromFiles.Name(), first); err != nil {
		return trustSet{}, err
	}
	ts := trustSet{roots: merged, components: []component{{name: "trust_files", run: fromFiles.Run}}}
	if fromXDS {
		ts.proxyConfig = trust.NewProxyConfigSource(merger)
	}
	if c.TrustConfigMap.IsZero() && c.TrustBundleSigner == "" {
		return ts, nil
	}

	rc, err := kubeclient.RESTConfig(kubeclient.Config{Kubeconfig: c.Kubeconfig, UserAgent: "meshagent/" + a.cfg.Version})
	if err != nil {
		return trustSet{}, configError(fmt.Errorf("MESHAGENT_TRUST_CONFIGMAP and MESHAGENT_TRUST_BUNDLE_SIGNER read the Kubernetes API: %w", err))
	}
	if r := c.TrustConfigMap; !r.IsZero() {
		core, err := kubeclient.NewForConfig(rc)
		if err != nil {
			return trustSet{}, err
		}
		src, err := trust.NewConfigMapSource(trust.ConfigMapConfig{
			Kube: core, Namespace: r.Namespace, Name: r.Name, Key: r.Key, Sink: merger, Logger: a.base,
		})
		if err != nil {
			return trustSet{}, err
		}
		a.status.AddReadiness("trust_configmap", synced(src, "the trust bundle ConfigMap "+r.String()+" is not read yet"))
		ts.components = append(ts.components, component{name: "trust_configmap", run: src.Run})
	}
	if signer := c.TrustBundleSigner; signer != "" {
		certs, err := kubeclient.NewCertificates(rc)
		if err != nil {
			return trustSet{}, err
		}
		src, err := trust.NewClusterTrustBundleSource(trust.ClusterTrustBundleConfig{
			Kube: certs, Signer: signer, Sink: merger, Logger: a.base,
		})
		if err != nil {
			return trustSet{}, err
		}
		a.status.AddReadiness("trust_bundle_signer", synced(src, "the ClusterTrustBundles of "+signer+" are not listed yet"))
		ts.components = append(ts.components, component{name: "trust_cluster_trust_bundles", run: src.Run})
	}
	return ts, nil
}

// synced is a readiness check that fails with msg until s has listed its
// objects once: until then the bundle may lack roots peers already use.
func synced(s interface{ HasSynced() bool }, msg string) func() error {
	return func() error {
		if !s.HasSynced() {
			return errors.New(msg)
		}
		return nil
	}
}

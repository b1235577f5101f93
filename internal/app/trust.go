package app

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/meshagent/meshagent/internal/files/outputcerts"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/trust"
	"github.com/meshagent/meshagent/secretmanager"
)

// trustRoots returns the roots a certificate source serves and verifies
// with (docs/trust.md): the root files' roots as they are when no cluster
// trust source is set; else a bundle of its own that holds the union of
// the files and the ConfigMap key, the ClusterTrustBundles and istiod's
// ProxyConfig the settings name, with the components that keep it live.
// The ProxyConfig source (PROXY_CONFIG_XDS_AGENT) is kept in
// a.proxyConfig for the xDS proxy, which feeds it. Every user of the roots
// (ROOTCA, the Workload API, OUTPUT_CERTS, the CA and xDS connections) then
// follows the union.
//
// The CRL file (MESHAGENT_CRL_FILE), when set, is followed into the roots
// returned, and served with them in ROOTCA.
func (a *App) trustRoots(fileRoots *secretmanager.Roots) (*secretmanager.Roots, []component, error) {
	roots, cs, err := a.clusterTrust(fileRoots)
	if err != nil || a.s.CRLFile == "" {
		return roots, cs, err
	}
	feed, err := trust.NewCRLFeed(trust.CRLFeedConfig{Path: a.s.CRLFile, Into: roots, Source: a.fileConfig()})
	if err != nil {
		return nil, nil, err
	}
	return roots, append(cs, component{name: "crl_watcher", run: feed.Run}), nil
}

// clusterTrust is trustRoots without the CRL.
func (a *App) clusterTrust(fileRoots *secretmanager.Roots) (*secretmanager.Roots, []component, error) {
	c := a.s
	fromXDS := c.ProxyConfigXDSAgent && c.XDSProxy && c.Mode != settings.ModeNode
	if c.TrustConfigMap.IsZero() && c.TrustBundleSigner == "" && !fromXDS {
		return fileRoots, nil, nil
	}
	first, source := fileRoots.Bundle()
	merged := secretmanager.RootsOf(first, source)
	merger, err := trust.NewMerger(trust.MergerConfig{Publisher: merged, Logger: a.base, Metrics: trust.NewMetrics(a.reg)})
	if err != nil {
		return nil, nil, err
	}
	fromFiles := trust.Follow("file:"+source, fileRoots, merger)
	// The files come first in the merge, as they are now.
	if err := merger.UpdateBundle(fromFiles.Name(), first); err != nil {
		return nil, nil, err
	}
	cs := []component{{name: "trust_files", run: fromFiles.Run}}
	if fromXDS {
		a.proxyConfig = trust.NewProxyConfigSource(merger)
	}
	if c.TrustConfigMap.IsZero() && c.TrustBundleSigner == "" {
		return merged, cs, nil
	}

	rc, err := kubeclient.RESTConfig(kubeclient.Config{Kubeconfig: c.Kubeconfig, UserAgent: "meshagent/" + a.cfg.Version})
	if err != nil {
		return nil, nil, configError(fmt.Errorf("MESHAGENT_TRUST_CONFIGMAP and MESHAGENT_TRUST_BUNDLE_SIGNER read the Kubernetes API: %w", err))
	}
	if r := c.TrustConfigMap; !r.IsZero() {
		core, err := kubeclient.NewForConfig(rc)
		if err != nil {
			return nil, nil, err
		}
		src, err := trust.NewConfigMapSource(trust.ConfigMapConfig{
			Kube: core, Namespace: r.Namespace, Name: r.Name, Key: r.Key, Sink: merger, Logger: a.base,
		})
		if err != nil {
			return nil, nil, err
		}
		a.status.AddReadiness("trust_configmap", synced(src, "the trust bundle ConfigMap "+r.String()+" is not read yet"))
		cs = append(cs, component{name: "trust_configmap", run: src.Run})
	}
	if signer := c.TrustBundleSigner; signer != "" {
		certs, err := kubeclient.NewCertificates(rc)
		if err != nil {
			return nil, nil, err
		}
		src, err := trust.NewClusterTrustBundleSource(trust.ClusterTrustBundleConfig{
			Kube: certs, Signer: signer, Sink: merger, Logger: a.base,
		})
		if err != nil {
			return nil, nil, err
		}
		a.status.AddReadiness("trust_bundle_signer", synced(src, "the ClusterTrustBundles of "+signer+" are not listed yet"))
		cs = append(cs, component{name: "trust_cluster_trust_bundles", run: src.Run})
	}
	return merged, cs, nil
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

// outputCertsConfig is the OUTPUT_CERTS writer's configuration, with its
// file modes, group and bundle file (MESHAGENT_OUTPUT_CERTS_*).
func (a *App) outputCertsConfig() outputcerts.Config {
	c := a.s
	return outputcerts.Config{
		Dir: c.OutputCerts, KeyMode: c.OutputKeyMode, CertMode: c.OutputCertMode,
		Group: c.OutputGroup, BundleFile: c.OutputBundleFile,
		Logger: a.base, Registerer: a.reg,
	}
}

// reloadHook is what tells an application that the OUTPUT_CERTS files
// changed (MESHAGENT_OUTPUT_CERTS_RELOAD_*); nil when nothing is asked.
func (a *App) reloadHook() (outputcerts.Reloader, error) {
	c := a.s
	h, err := outputcerts.NewHook(outputcerts.HookConfig{
		Command: strings.Fields(c.ReloadCommand), Timeout: c.ReloadTimeout,
		PIDFile: c.ReloadPIDFile, ProcessName: c.ReloadProcess, Signal: signals[c.ReloadSignal],
		Logger: a.base,
	})
	if err != nil || h == nil {
		return nil, err
	}
	return h, nil
}

// signals are MESHAGENT_OUTPUT_CERTS_RELOAD_SIGNAL's values.
var signals = map[string]syscall.Signal{
	"SIGHUP": syscall.SIGHUP, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGINT": syscall.SIGINT,
	"SIGTERM": syscall.SIGTERM, "SIGQUIT": syscall.SIGQUIT, "SIGWINCH": syscall.SIGWINCH,
}

// bundleMapTrustDomain is the trust domain of OUTPUT_CERTS' SPIFFE trust
// bundle map (MESHAGENT_SPIFFE_BUNDLE_MAP); "" for none.
func (a *App) bundleMapTrustDomain() string {
	if !a.s.SPIFFEBundleMap || a.s.CAProvider == settings.ProviderLinkerd {
		return ""
	}
	return a.s.TrustDomain
}

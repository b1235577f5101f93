package app

import (
	"strings"
	"syscall"

	"github.com/meshagent/meshagent/internal/files/outputcerts"
	"github.com/meshagent/meshagent/internal/settings"
)

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
		return nil, settingError(err, hookSettings)
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

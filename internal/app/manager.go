package app

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/files/fileprovider"
	"github.com/meshagent/meshagent/internal/files/outputcerts"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/status"
	"github.com/meshagent/meshagent/internal/trust"
	"github.com/meshagent/meshagent/podcert"
	"github.com/meshagent/meshagent/secretmanager"
)

// certSource is what the certificate source chosen at start-up made, as
// the serving components need it.
type certSource struct {
	// manager serves the secrets; nil with SourceExternal.
	manager *secretmanager.Manager
	// caRoots verifies the CA (CA_ROOT_CA); nil without a CA. The xDS proxy
	// shares it when XDS_ROOT_CA names the same file.
	caRoots *secretmanager.Roots
	// components run the manager and whatever feeds it.
	components []component
	// podRoots verify pod certificates (podCertificates), which manager
	// signs (its CSRSigner); nil without a CA.
	podRoots podcert.RootSource
	// preconnect, when set, starts the CA connection: the first thing Run
	// does.
	preconnect func()
	// proxyConfig takes the mesh's roots from istiod's ProxyConfig
	// (PROXY_CONFIG_XDS_AGENT); the xDS proxy feeds it. Nil when off.
	proxyConfig *trust.ProxyConfigSource
}

// errSourceUnavailable: a source without a way to make it (a source added
// to SelectSource but not to certificateSource).
var errSourceUnavailable = errors.New("no certificate source for this mode")

// certificateSource builds the secret manager and the components that
// produce workload certificates from the chosen source. A CA's client
// sends the token of tokens; in node mode, pods is the pod index.
func (a *App) certificateSource(tokens tokenSource, pods *nodePods) (certSource, error) {
	switch a.source.Source {
	case SourceDev:
		return a.devSource()
	case SourceExternal:
		a.status.AddReadiness("certificate_source", func() error { return nil })
		return certSource{}, nil
	case SourceCA:
		return a.caSource(tokens, pods)
	case SourceWorkloadCredentials:
		return a.fileSource(a.s.WorkloadCredentialsDir, "workload-credentials", "MESHAGENT_WORKLOAD_CREDENTIALS_DIR")
	case SourceFileMounted:
		return a.fileSource(a.s.FileMountedCertsDir, "file-mounted", "FILE_MOUNTED_CERTS=true serves MESHAGENT_FILE_MOUNTED_CERTS_DIR")
	}
	return certSource{}, fmt.Errorf("%w: %s (%s)", errSourceUnavailable, a.source.Source, a.source.Reason)
}

// managerConfig fills the parts of a secret manager's configuration common to
// every source.
func (a *App) managerConfig(id pki.Identity, roots secretmanager.RootSource, source string) secretmanager.Config {
	c := a.s
	renewal := c.Scheme().Renewal()
	mc := secretmanager.Config{
		Identity:    id,
		KeyType:     c.KeyType,
		Roots:       roots,
		TTL:         c.SecretTTL,
		GraceRatio:  c.GraceRatio,
		GraceJitter: c.GraceJitter,
		// The scheme's clamp of the renewal delay (Linkerd's [10s, 24h]).
		MinRenewDelay: renewal.MinDelay,
		MaxRenewDelay: renewal.MaxDelay,
		// Sidecar: one identity; the bound matters once callers carry their own.
		MaxConcurrentCSRs: c.CAMaxConcurrentCSRs,
		IdleGrace:         c.IdentityIdleGrace,
		Source:            source,
		Clock:             a.clock,
		Logger:            a.base,
		Registerer:        a.reg,
		OnPublish:         a.noteFirstCert,
	}
	return mc
}

// newManager makes the secret manager of mc, with the provider of
// file-cert: and file-root: resources, and registers its health and
// certificate listing. It returns the manager and the components that run
// it and the provider. client, when not nil, is closed when the manager
// stops, or when New fails.
func (a *App) newManager(mc secretmanager.Config, client caclient.Client) (*secretmanager.Manager, []component, error) {
	fc := fileprovider.Config{Files: a.fileConfig(), Logger: a.base}
	// The provider makes its sources when they are asked for: check their
	// configuration now.
	if err := fc.Files.Validate(); err != nil {
		return nil, nil, configError(settingError(err, fileSettings))
	}
	if len(a.s.SDSAllowedUIDs) == 0 {
		// Anyone who can open the socket may ask: only the listed
		// directories' files are served (docs/configuration.md).
		// The directories the agent is told to read certificates from are
		// allowed too, wherever the operator moved them.
		fc.AllowedDirs = append(a.s.FileResourceDirList(), a.s.FileMountedCertsDir, a.s.WorkloadCredentialsDir)
		if a.s.CARoot != "" && a.s.CARoot != settings.SystemRoots {
			fc.AllowedDirs = append(fc.AllowedDirs, filepath.Dir(a.s.CARoot))
		}
	}
	files := fileprovider.New(fc)
	if a.fileResources() {
		mc.Providers = map[string]secretmanager.Provider{
			secretmanager.FileCertPrefix: files,
			secretmanager.FileRootPrefix: files,
		}
	}
	if client != nil {
		a.undo = append(a.undo, func() { _ = client.Close() })
	}
	m, err := secretmanager.New(mc)
	if err != nil {
		return nil, nil, configError(settingError(err, managerSettings))
	}
	a.status.AddReadiness("workload_certificate", m.Ready)
	a.status.AddLiveness("workload_certificate", m.Live)
	if !a.nodeMode() { // node mode lists the pods of each identity too (reportPods)
		a.status.AddCertLister(managerLister{m: m})
	}
	return m, []component{{name: "secretmanager", run: func(ctx context.Context) error {
		if client != nil {
			defer client.Close()
		}
		return m.Run(ctx)
	}}, {name: "file_resources", run: files.Run}}, nil
}

// managerLister lists the manager's certificates for /debug/certs; with
// pods (node mode), each workload certificate with how many pods use its
// identity.
type managerLister struct {
	m    *secretmanager.Manager
	pods func() map[string][]string
}

func (l managerLister) Certs() []status.CertInfo {
	in := l.m.Certs()
	var pods map[string][]string
	if l.pods != nil {
		pods = l.pods()
	}
	out := make([]status.CertInfo, len(in))
	for i, c := range in {
		out[i] = status.CertInfo{Cert: status.Cert(c)}
		if c.ResourceName == secretmanager.WorkloadCertName {
			out[i].Pods = len(pods[c.Identity])
		}
	}
	return out
}

// devSource makes the in-memory development CA and a secret
// manager that asks it.
func (a *App) devSource() (certSource, error) {
	id, err := a.s.Identity()
	if err != nil {
		return certSource{}, configError(err)
	}
	ca, err := localca.New(localca.Config{Name: "meshagent dev CA", Intermediate: true, Now: a.clock.Now})
	if err != nil {
		return certSource{}, fmt.Errorf("creating the dev CA: %w", err)
	}
	a.log.Warn("dev mode: certificates come from an in-memory CA with a fresh root; not for production",
		zap.String(logkeys.Identity, id.String()), zap.String(logkeys.RootSerial, ca.Root().SerialNumber.Text(16)))
	client, err := devca.New(devca.Config{CA: ca})
	if err != nil {
		return certSource{}, err
	}
	roots, err := secret.NewRoots(ca.RootPEM(), "dev-ca")
	if err != nil {
		return certSource{}, err
	}
	mc := a.managerConfig(id, roots, "dev-ca")
	mc.CA = client
	mc.CSRSigner = localCASigner{ca: ca}
	m, cs, err := a.newManager(mc, client)
	return certSource{manager: m, components: cs, podRoots: roots}, err
}

// caSource asks the CA named by CA_PROVIDER.
func (a *App) caSource(tokens tokenSource, pods *nodePods) (certSource, error) {
	id, err := a.s.Identity()
	if err != nil {
		return certSource{}, configError(err)
	}
	rootFeed, err := a.rootFeed("ca_root", a.s.CARoot)
	if err != nil {
		return certSource{}, a.caRootError(err)
	}
	ts, err := a.trustRoots(rootFeed.Roots())
	if err != nil {
		return certSource{}, err
	}
	roots := ts.roots
	client, err := a.caClient(roots, tokens, pods)
	if err != nil {
		return certSource{}, err
	}
	var preconnect func()
	if p, ok := client.(caclient.Preconnecter); ok {
		preconnect = p.Preconnect
	}
	mc := a.managerConfig(id, roots, "ca")
	mc.CA = client
	if a.s.CAProvider != settings.ProviderLinkerd { // Linkerd's CA signs no stub CSR
		mc.CSRSigner = client
	}
	mc.Initial = a.outputCertsInitial(id)
	m, cs, err := a.newManager(mc, client)
	if err != nil {
		return certSource{}, err
	}
	cs = append(cs, component{name: "ca_root_watcher", run: rootFeed.Run})
	cs = append(cs, ts.components...)
	return certSource{manager: m, caRoots: roots, components: cs, podRoots: roots,
		preconnect: preconnect, proxyConfig: ts.proxyConfig}, nil
}

// caRootError is the configuration error of a CA root that cannot be read
// at start-up: missing, unreadable, a directory or no PEM certificate. It
// names the setting the path came from and what to set.
func (a *App) caRootError(err error) error {
	if inner := errors.Unwrap(err); inner != nil {
		err = inner // the feed's own wrapping repeats the path
	}
	from := ""
	switch {
	case settingSet(a.s, "CA_ROOT_CA"):
	case a.s.ProvCert != "":
		from = " (from PROV_CERT)"
	default:
		from = " (the default)"
	}
	return configError(fmt.Errorf("CA_ROOT_CA=%s%s cannot be used: %w; set CA_ROOT_CA to a PEM file of the CA's root certificates, or SYSTEM", a.s.CARoot, from, err))
}

// outputCertsInitial returns a still-valid certificate for id found in
// OUTPUT_CERTS, to serve at once after a restart.
func (a *App) outputCertsInitial(id pki.Identity) *secretmanager.Secret {
	if a.s.OutputCerts == "" {
		return nil
	}
	p, err := outputcerts.Load(a.s.OutputCerts, id, a.clock.Now())
	if err != nil {
		a.log.Info("no reusable certificate in OUTPUT_CERTS", zap.String(logkeys.Path, a.s.OutputCerts), zap.Error(err))
		return nil
	}
	return &secretmanager.Secret{
		Name: secretmanager.WorkloadCertName, Identity: id,
		CertChain: p.ChainPEM, PrivateKey: p.KeyPEM, Leaf: p.Leaf(), NotAfter: p.Leaf().NotAfter,
		Source: "output-certs",
	}
}

// fileSource serves certificate files from dir (workload credentials or
// file-mounted certificates, docs/modes.md), watching them. setting says
// which setting chose dir, for the error.
func (a *App) fileSource(dir, source, setting string) (certSource, error) {
	rootFeed, err := a.rootFeed(source+"_root", filepath.Join(dir, files.RootCertFile))
	if err != nil {
		if inner := errors.Unwrap(err); inner != nil {
			err = inner // the feed's own wrapping repeats the path
		}
		fix := "put a PEM bundle of the roots there"
		if source == "file-mounted" {
			fix = "put cert-chain.pem, key.pem and root-cert.pem in it, or unset FILE_MOUNTED_CERTS"
		}
		return certSource{}, configError(fmt.Errorf("%s=%s: %w; %s", setting, dir, err, fix))
	}
	ts, err := a.trustRoots(rootFeed.Roots())
	if err != nil {
		return certSource{}, err
	}
	m, cs, err := a.newManager(a.managerConfig(pki.Identity{}, ts.roots, source), nil)
	if err != nil {
		return certSource{}, err
	}
	cs = append(cs, ts.components...)
	pairFeed, err := certfile.NewPairFeed(certfile.PairFeedConfig{
		CertPath: filepath.Join(dir, files.CertChainFile), KeyPath: filepath.Join(dir, files.KeyFile),
		Label: source, Into: m, Source: a.fileConfig(),
	})
	if err != nil {
		return certSource{}, err
	}
	cs = append(cs,
		component{name: source + "_root_watcher", run: rootFeed.Run},
		component{name: source + "_watcher", run: pairFeed.Run})
	return certSource{manager: m, components: cs, proxyConfig: ts.proxyConfig}, nil
}

func (a *App) fileConfig() certfile.SourceConfig {
	return certfile.SourceConfig{Debounce: a.s.FileDebounce, Clock: a.clock, Logger: a.base, Registerer: a.reg}
}

// rootFeed reads the root bundle at path (a file, or the system roots) for
// the setting name, to be followed while the agent runs.
func (a *App) rootFeed(name, path string) (*certfile.RootFeed, error) {
	return certfile.NewRootFeed(certfile.RootFeedConfig{Name: name, Path: path, Source: a.fileConfig()})
}

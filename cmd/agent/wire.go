package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/caclient/istio"
	"github.com/meshagent/meshagent/caclient/linkerd"
	"github.com/meshagent/meshagent/certfile"
	"github.com/meshagent/meshagent/fileprovider"
	"github.com/meshagent/meshagent/grpcbootstrap"
	"github.com/meshagent/meshagent/localca"
	"github.com/meshagent/meshagent/outputcerts"
	"github.com/meshagent/meshagent/pki"
	"github.com/meshagent/meshagent/sds"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/settings"
	"github.com/meshagent/meshagent/status"
	"github.com/meshagent/meshagent/udsserver"
	"github.com/meshagent/meshagent/workloadapi"
	"github.com/meshagent/meshagent/xdsproxy"
)

// Certificate files in a credentials directory (SPEC 2).
const (
	certChainFile = "cert-chain.pem"
	keyFile       = "key.pem"
	rootCertFile  = "root-cert.pem"
)

// linkerd renewal clamp (SPEC 8).
const (
	linkerdMinRenewDelay = 10 * time.Second
	linkerdMaxRenewDelay = 24 * time.Hour
)

// served is what the serving components share once the source is built: the
// secret manager and the workload certificate last published, for the xDS
// proxy's client certificate.
type served struct {
	manager *secretmanager.Manager
	// caRoots verifies the CA; nil without a CA.
	caRoots caclient.RootSource
	// files serves file-cert: and file-root: resources; set by managerConfig.
	files *fileprovider.Provider

	mu      sync.Mutex
	latest  map[string]*secretmanager.Secret
	updated chan struct{} // one slot: something in latest changed

	clientCert atomic.Pointer[tls.Certificate]
}

func newServed() *served {
	return &served{latest: map[string]*secretmanager.Secret{}, updated: make(chan struct{}, 1)}
}

// onPublish records every published secret; it never blocks.
func (s *served) onPublish(sec *secretmanager.Secret) {
	if !sec.IsRoot() {
		if c, err := tls.X509KeyPair(sec.CertChain, sec.PrivateKey); err == nil {
			s.clientCert.Store(&c)
		}
	}
	s.mu.Lock()
	s.latest[sec.Name] = sec
	s.mu.Unlock()
	select {
	case s.updated <- struct{}{}:
	default:
	}
}

func (s *served) snapshot() (cert, root *secretmanager.Secret) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latest[secretmanager.WorkloadCertName], s.latest[secretmanager.RootCertName]
}

func (s *served) workloadCertificate() (*tls.Certificate, error) {
	if c := s.clientCert.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("no workload certificate yet")
}

// managerConfig fills the parts of a secret manager's configuration common to
// every source.
func (a *agent) managerConfig(id pki.Identity, roots secretmanager.RootSource, source string) secretmanager.Config {
	c := a.cfg
	mc := secretmanager.Config{
		Identity:    id,
		KeyType:     c.KeyType,
		Roots:       roots,
		TTL:         c.SecretTTL,
		GraceRatio:  c.GraceRatio,
		GraceJitter: c.GraceJitter,
		// Sidecar: one identity; the bound matters once callers carry their own.
		MaxConcurrentCSRs: c.CAMaxConcurrentCSRs,
		OnPublish:         a.served.onPublish,
		Source:            source,
		Logger:            a.base,
		Registerer:        a.reg,
	}
	a.served.files = fileprovider.New(fileprovider.Config{Files: a.fileConfig(), Logger: a.base})
	mc.Providers = map[string]secretmanager.Provider{
		secretmanager.FileCertPrefix: a.served.files,
		secretmanager.FileRootPrefix: a.served.files,
	}
	if mc.GraceJitter == 0 {
		mc.GraceJitter = -1 // zero means none; the manager reads 0 as "default"
	}
	if c.CAProvider == settings.ProviderLinkerd {
		mc.MinRenewDelay, mc.MaxRenewDelay = linkerdMinRenewDelay, linkerdMaxRenewDelay
	}
	return mc
}

// useManager registers the manager's health and certificate listing.
func (a *agent) useManager(m *secretmanager.Manager) {
	a.served.manager = m
	a.status.AddReadiness("workload_certificate", m.Ready)
	a.status.AddLiveness("workload_certificate", m.Live)
	a.status.AddCertLister(managerLister{m})
}

type managerLister struct{ m *secretmanager.Manager }

func (l managerLister) Certs() []status.CertInfo {
	in := l.m.Certs()
	out := make([]status.CertInfo, len(in))
	for i, c := range in {
		out[i] = status.CertInfo{
			ResourceName: c.ResourceName, Identity: c.Identity, Serial: c.Serial,
			NotBefore: c.NotBefore, NotAfter: c.NotAfter, RenewAt: c.RenewAt, Source: c.Source,
		}
	}
	return out
}

// devSource makes the in-memory development CA (SPEC 5.5) and a secret
// manager that asks it.
func (a *agent) devSource() ([]component, error) {
	id, err := a.cfg.Identity()
	if err != nil {
		return nil, configError{err}
	}
	ca, err := localca.New(localca.Config{Name: "meshagent dev CA", Intermediate: true})
	if err != nil {
		return nil, fmt.Errorf("creating the dev CA: %w", err)
	}
	a.log.Warn("dev mode: certificates come from an in-memory CA with a fresh root; not for production",
		zap.String(keyIdentity, id.String()), zap.String(keyRoot, ca.Root().SerialNumber.Text(16)))
	client, err := devca.New(devca.Config{CA: ca})
	if err != nil {
		return nil, err
	}
	roots, err := secretmanager.NewRoots(ca.RootPEM(), "dev-ca")
	if err != nil {
		return nil, err
	}
	mc := a.managerConfig(id, roots, "dev-ca")
	mc.CA = client
	return a.startManager(mc, client)
}

// caSource asks the CA named by CA_PROVIDER (SPEC 5.4, 6).
func (a *agent) caSource() ([]component, error) {
	c := a.cfg
	id, err := c.Identity()
	if err != nil {
		return nil, configError{err}
	}
	roots, rootsRun, err := a.watchedRoots("ca_root", c.CARoot)
	if err != nil {
		return nil, err
	}
	a.served.caRoots = roots
	client, err := a.caClient(roots)
	if err != nil {
		return nil, err
	}
	mc := a.managerConfig(id, roots, "ca")
	mc.CA = client
	mc.Initial = a.outputCertsInitial(id)
	cs, err := a.startManager(mc, client)
	if err != nil {
		return nil, err
	}
	return append(cs, component{name: "ca_root_watcher", run: rootsRun}), nil
}

func (a *agent) startManager(mc secretmanager.Config, client caclient.Client) ([]component, error) {
	m, err := secretmanager.New(mc)
	if err != nil {
		if client != nil {
			_ = client.Close()
		}
		return nil, configError{err}
	}
	a.useManager(m)
	return []component{{name: "secretmanager", run: func(ctx context.Context) error {
		if client != nil {
			defer client.Close()
		}
		return m.Run(ctx)
	}}, {name: "file_resources", run: a.served.files.Run}}, nil
}

// caClient builds the CA client for CA_PROVIDER.
func (a *agent) caClient(roots caclient.RootSource) (caclient.Client, error) {
	c := a.cfg
	md := map[string]string{}
	for k, v := range c.CAHeaders {
		md[k] = v
	}
	tokens, err := a.tokenFetcher()
	if err != nil {
		return nil, err
	}
	t := caclient.TransportConfig{
		Addr:     c.CAAddr,
		Roots:    roots,
		Token:    tokens,
		Metadata: md,
	}
	if c.CAProvider == settings.ProviderLinkerd {
		t.ServerName = c.LinkerdIdentityServiceName
		return linkerd.New(linkerd.Config{
			Transport: t, ControlPlaneNamespace: c.LinkerdNamespace, TrustDomain: c.TrustDomain,
			Logger: a.base, Registerer: a.reg,
		})
	}
	t.ServerName = c.IstiodSAN
	t.Plaintext = istio.PlaintextPort(c.CAAddr)
	if c.ClusterID != "" {
		md["ClusterID"] = c.ClusterID
	}
	if c.ProvCert != "" {
		dir := c.ProvCert
		t.ClientCertificate = func() (*tls.Certificate, error) {
			p, err := certfile.LoadPair(filepath.Join(dir, certChainFile), filepath.Join(dir, keyFile), time.Now())
			if err != nil {
				return nil, err
			}
			return p.TLSCertificate(), nil
		}
		t.TokenOptional = true
	}
	return istio.New(istio.Config{Transport: t, CertSigner: c.CertSigner, Logger: a.base, Registerer: a.reg})
}

// outputCertsInitial returns a still-valid certificate for id found in
// OUTPUT_CERTS (SPEC 11), to serve at once after a restart.
func (a *agent) outputCertsInitial(id pki.Identity) *secretmanager.Secret {
	if a.cfg.OutputCerts == "" {
		return nil
	}
	p, err := outputcerts.Load(a.cfg.OutputCerts, id, time.Now())
	if err != nil {
		a.log.Info("no reusable certificate in OUTPUT_CERTS", zap.String(keyPath, a.cfg.OutputCerts), zap.Error(err))
		return nil
	}
	return &secretmanager.Secret{
		Name: secretmanager.WorkloadCertName, Identity: id,
		CertChain: p.ChainPEM, PrivateKey: p.KeyPEM, Leaf: p.Leaf(), NotAfter: p.Leaf().NotAfter,
		Source: "output-certs",
	}
}

// fileSource serves certificate files from dir (workload credentials or
// file-mounted certificates, SPEC 5.2 and 5.3), watching them.
func (a *agent) fileSource(dir, source string) ([]component, error) {
	roots, rootsRun, err := a.watchedRoots(source+"_root", filepath.Join(dir, rootCertFile))
	if err != nil {
		return nil, err
	}
	pairs, err := certfile.NewPairSource(a.fileConfig(), filepath.Join(dir, certChainFile), filepath.Join(dir, keyFile))
	if err != nil {
		return nil, err
	}
	mc := a.managerConfig(pki.Identity{}, roots, source)
	cs, err := a.startManager(mc, nil)
	if err != nil {
		return nil, err
	}
	m := a.served.manager
	follow := func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		g.Go(func() error { return pairs.Run(ctx) })
		g.Go(func() error {
			pairs.Follow(ctx, func(p *certfile.Pair) {
				sec := &secretmanager.Secret{
					Name: secretmanager.WorkloadCertName, CertChain: p.ChainPEM, PrivateKey: p.KeyPEM,
					Leaf: p.Leaf(), NotAfter: p.Leaf().NotAfter, Source: source,
				}
				if id, err := pki.IdentityOf(p.Leaf()); err == nil {
					sec.Identity = id
				}
				if err := m.Publish(sec); err != nil {
					a.log.Warn("certificate files not served", zap.String(keyPath, dir), zap.Error(err))
				}
			})
			return nil
		})
		return g.Wait()
	}
	return append(cs,
		component{name: source + "_root_watcher", run: rootsRun},
		component{name: source + "_watcher", run: follow}), nil
}

func (a *agent) fileConfig() certfile.SourceConfig {
	return certfile.SourceConfig{Debounce: a.cfg.FileDebounce, Logger: a.base, Registerer: a.reg}
}

// watchedRoots loads a root bundle file (or the system roots) and returns a
// RootSource that follows the file, and the component that watches it.
func (a *agent) watchedRoots(name, path string) (*secretmanager.Roots, func(context.Context) error, error) {
	src, err := certfile.LoadRootSource(a.fileConfig(), path)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", name, path, err)
	}
	b, _, _ := src.Current()
	roots, err := secretmanager.NewRoots(b.PEM, path)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", name, path, err)
	}
	run := func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		g.Go(func() error { return src.Run(ctx) })
		g.Go(func() error {
			src.Follow(ctx, func(b *certfile.Bundle) {
				if err := roots.Set(b.PEM, path); err != nil {
					a.log.Warn("root bundle not applied", zap.String(keyPath, path), zap.Error(err))
				}
			})
			return nil
		})
		return g.Wait()
	}
	return roots, run, nil
}

// servingComponents are the local socket (SDS and, unless turned off, the
// SPIFFE Workload API), the xDS proxy, the OUTPUT_CERTS writer and the gRPC
// bootstrap writer, as configured.
func (a *agent) servingComponents() ([]component, error) {
	c := a.cfg
	var cs []component
	m := a.served.manager
	if m != nil && !c.DisableEnvoy {
		srv, err := sds.New(sds.Config{Secrets: m, MaxStreams: c.SDSMaxStreams, Logger: a.base, Registerer: a.reg})
		if err != nil {
			return nil, err
		}
		services := []func(*grpc.Server){srv.Register}
		if c.WorkloadAPI {
			wl, err := workloadapi.New(workloadapi.Config{Secrets: m, Logger: a.base, Registerer: a.reg})
			if err != nil {
				return nil, err
			}
			services = append(services, wl.Register)
		}
		socket, err := udsserver.New(udsserver.Config{
			SocketPath: c.SDSSocket, Services: services,
			MaxRecvBytes: c.SDSMaxRecvBytes, AllowedUIDs: c.SDSAllowedUIDs, Logger: a.base, Registerer: a.reg,
		})
		if err != nil {
			return nil, err
		}
		cs = append(cs, component{name: "sds", run: socket.Run})
	}
	if c.XDSProxy {
		xp, rootsRun, err := a.xdsProxy()
		if err != nil {
			return nil, err
		}
		a.status.AddReadiness("xds_upstream", xp.Ready)
		cs = append(cs, component{name: "xdsproxy", run: xp.Run})
		if rootsRun != nil {
			cs = append(cs, component{name: "xds_root_watcher", run: rootsRun})
		}
	}
	if m != nil && c.OutputCerts != "" {
		w, err := outputcerts.New(outputcerts.Config{Dir: c.OutputCerts, Logger: a.base, Registerer: a.reg})
		if err != nil {
			return nil, err
		}
		cs = append(cs, component{name: "outputcerts", run: a.writeOutputCerts(w)})
	}
	if c.DisableEnvoy || settingSet(c, "GRPC_XDS_BOOTSTRAP") {
		cs = append(cs, component{name: "grpc_bootstrap", run: a.writeBootstrap, finite: true})
	}
	return cs, nil
}

// xdsProxy builds the proxy and, when the xDS root is a file of its own, the
// component that follows it (SPEC 7).
func (a *agent) xdsProxy() (*xdsproxy.Proxy, func(context.Context) error, error) {
	c := a.cfg
	md := map[string]string{}
	for k, v := range c.XDSHeaders {
		md[k] = v
	}
	if c.ClusterID != "" {
		md["ClusterID"] = c.ClusterID
	}
	var (
		roots    caclient.RootSource
		rootsRun func(context.Context) error
	)
	if c.XDSRoot == c.CARoot && a.served.caRoots != nil {
		roots = a.served.caRoots
	} else if r, run, err := a.watchedRoots("xds_root", c.XDSRoot); err == nil {
		roots, rootsRun = r, run
	} else {
		// Not fatal: the proxy then cannot verify the control plane and
		// says so at every attempt.
		a.log.Warn("xDS root not loaded; the control plane cannot be verified", zap.String(keyPath, c.XDSRoot), zap.Error(err))
		roots = caclient.StaticRoots{Pool: pki.CertPool(nil)}
	}
	tokens, err := a.tokenFetcher()
	if err != nil {
		return nil, nil, err
	}
	xp, err := xdsproxy.New(xdsproxy.Config{
		SocketPath: c.XDSSocket,
		Upstream: caclient.TransportConfig{
			Addr:              c.DiscoveryAddress,
			ServerName:        c.IstiodSAN,
			Roots:             roots,
			Plaintext:         istio.PlaintextPort(c.DiscoveryAddress),
			Token:             tokens,
			TokenOptional:     true,
			Metadata:          md,
			ClientCertificate: a.served.workloadCertificate,
		},
		Logger:     a.base,
		Registerer: a.reg,
	})
	if err != nil {
		return nil, nil, err
	}
	return xp, rootsRun, nil
}

// writeOutputCerts writes the latest certificate and roots after every
// publication (SPEC 11).
func (a *agent) writeOutputCerts(w *outputcerts.Writer) func(context.Context) error {
	return func(ctx context.Context) error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-a.served.updated:
			}
			cert, root := a.served.snapshot()
			var f outputcerts.Files
			if cert != nil {
				f.CertChain, f.Key = cert.CertChain, cert.PrivateKey
			}
			if root != nil {
				f.Root = root.Roots
			}
			if _, err := w.Write(f); err != nil {
				a.log.Error("writing OUTPUT_CERTS failed", zap.String(keyPath, w.Dir()), zap.Error(err))
			}
		}
	}
}

// writeBootstrap writes the gRPC xDS bootstrap once (SPEC 11).
func (a *agent) writeBootstrap(context.Context) error {
	c := a.cfg
	ns := c.PodNamespace
	pod := c.PodName
	if pod == "" {
		pod, _ = os.Hostname()
	}
	_, err := grpcbootstrap.WriteFile(c.GRPCXDSBootstrap, grpcbootstrap.Config{
		XDSSocket:    c.XDSSocket,
		NodeID:       grpcbootstrap.SidecarNodeID(c.InstanceIP, pod, ns, ""),
		NodeMetadata: map[string]any{"CLUSTER_ID": c.ClusterID, "NAMESPACE": ns},
		CertDir:      c.OutputCerts,
		SecretTTL:    c.SecretTTL,
	})
	if err != nil {
		return fmt.Errorf("writing the gRPC bootstrap: %w", err)
	}
	a.log.Info("wrote the gRPC xDS bootstrap", zap.String(keyPath, c.GRPCXDSBootstrap))
	return nil
}

// settingSet reports whether the user set the named setting.
func settingSet(c *settings.Config, name string) bool {
	for _, r := range c.Table() {
		if r.Name == name {
			return r.Source != settings.SourceDefault
		}
	}
	return false
}

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/caclient/istio"
	"github.com/meshagent/meshagent/caclient/linkerd"
	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/files/fileprovider"
	"github.com/meshagent/meshagent/internal/files/grpcbootstrap"
	"github.com/meshagent/meshagent/internal/files/outputcerts"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/status"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/internal/uds/streamlimit"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/sds"
	"github.com/meshagent/meshagent/secretmanager"
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

// certSource is what the certificate source chosen at start-up made, as
// the serving components need it.
type certSource struct {
	// manager serves the secrets; nil in external mode.
	manager *secretmanager.Manager
	// caRoots verifies the CA (CA_ROOT_CA); nil without a CA. The xDS proxy
	// shares it when XDS_ROOT_CA names the same file.
	caRoots *secretmanager.Roots
	// components run the manager and whatever feeds it.
	components []component
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
		IdleGrace:         c.IdentityIdleGrace,
		Source:            source,
		Logger:            a.base,
		Registerer:        a.reg,
		OnPublish:         a.noteFirstCert,
	}
	if mc.GraceJitter == 0 {
		mc.GraceJitter = -1 // zero means none; the manager reads 0 as "default"
	}
	if c.CAProvider == settings.ProviderLinkerd {
		mc.MinRenewDelay, mc.MaxRenewDelay = linkerdMinRenewDelay, linkerdMaxRenewDelay
	}
	return mc
}

// startManager makes the secret manager of mc, with the provider of
// file-cert: and file-root: resources, registers its health and certificate
// listing, and returns it with the components that run them. client, when
// not nil, is closed when the manager stops (or now, if it cannot be made).
func (a *agent) startManager(mc secretmanager.Config, client caclient.Client) (*secretmanager.Manager, []component, error) {
	files := fileprovider.New(fileprovider.Config{Files: a.fileConfig(), Logger: a.base})
	// Node mode serves many pods from one socket: files of the node are not
	// served, so one pod cannot read what is meant for another, unless the
	// operator says every pod may read them.
	if a.nodeMode() && a.cfg.NodeFileResources {
		a.log.Warn("node mode: file-cert: and file-root: resources are served (MESHAGENT_NODE_FILE_RESOURCES): any pod on the node can read the files the agent can read")
	}
	if !a.nodeMode() || a.cfg.NodeFileResources {
		mc.Providers = map[string]secretmanager.Provider{
			secretmanager.FileCertPrefix: files,
			secretmanager.FileRootPrefix: files,
		}
	}
	m, err := secretmanager.New(mc)
	if err != nil {
		if client != nil {
			_ = client.Close()
		}
		return nil, nil, configError{err}
	}
	a.status.AddReadiness("workload_certificate", m.Ready)
	a.status.AddLiveness("workload_certificate", m.Live)
	if !a.nodeMode() { // node mode lists the pods of each identity too (nodeCallers)
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
// pods (node mode), each workload certificate with the pods using its
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
		out[i] = status.CertInfo{
			ResourceName: c.ResourceName, Identity: c.Identity, Serial: c.Serial,
			NotBefore: c.NotBefore, NotAfter: c.NotAfter, RenewAt: c.RenewAt, Source: c.Source,
		}
		if c.ResourceName == secretmanager.WorkloadCertName {
			out[i].Pods = pods[c.Identity]
		}
	}
	return out
}

// devSource makes the in-memory development CA (SPEC 5.5) and a secret
// manager that asks it.
func (a *agent) devSource() (certSource, error) {
	id, err := a.cfg.Identity()
	if err != nil {
		return certSource{}, configError{err}
	}
	ca, err := localca.New(localca.Config{Name: "meshagent dev CA", Intermediate: true})
	if err != nil {
		return certSource{}, fmt.Errorf("creating the dev CA: %w", err)
	}
	a.log.Warn("dev mode: certificates come from an in-memory CA with a fresh root; not for production",
		zap.String(keyIdentity, id.String()), zap.String(keyRoot, ca.Root().SerialNumber.Text(16)))
	client, err := devca.New(devca.Config{CA: ca})
	if err != nil {
		return certSource{}, err
	}
	roots, err := secretmanager.NewRoots(ca.RootPEM(), "dev-ca")
	if err != nil {
		return certSource{}, err
	}
	mc := a.managerConfig(id, roots, "dev-ca")
	mc.CA = client
	m, cs, err := a.startManager(mc, client)
	return certSource{manager: m, components: cs}, err
}

// caSource asks the CA named by CA_PROVIDER (SPEC 5.4, 6).
func (a *agent) caSource() (certSource, error) {
	c := a.cfg
	id, err := c.Identity()
	if err != nil {
		return certSource{}, configError{err}
	}
	rootFeed, err := a.rootFeed("ca_root", c.CARoot)
	if err != nil {
		return certSource{}, err
	}
	roots := rootFeed.Roots()
	client, err := a.caClient(roots)
	if err != nil {
		return certSource{}, err
	}
	// Connect now, off this goroutine: the handshakes with the CA then run
	// while the servers start and the key is made, not after them on the way
	// to the first CSR, and making the connection does not delay the servers.
	if p, ok := client.(caclient.Preconnecter); ok {
		go p.Preconnect()
	}
	mc := a.managerConfig(id, roots, "ca")
	mc.CA = client
	mc.Initial = a.outputCertsInitial(id)
	m, cs, err := a.startManager(mc, client)
	if err != nil {
		return certSource{}, err
	}
	cs = append(cs, component{name: "ca_root_watcher", run: rootFeed.Run})
	return certSource{manager: m, caRoots: roots, components: cs}, nil
}

// caClient builds the CA client for CA_PROVIDER.
func (a *agent) caClient(roots caclient.RootSource) (caclient.Client, error) {
	c := a.cfg
	md := map[string]string{}
	for k, v := range c.CAHeaders {
		md[k] = v
	}
	if c.CAProvider == settings.ProviderLinkerd && a.nodeMode() {
		tokenFor, err := a.linkerdNodeTokens()
		if err != nil {
			return nil, err
		}
		return linkerd.New(linkerd.Config{
			Transport: caclient.TransportConfig{
				Addr: c.CAAddr, Roots: roots, Metadata: md, ServerName: c.LinkerdIdentityServiceName,
			},
			ControlPlaneNamespace: c.LinkerdNamespace, TrustDomain: c.TrustDomain,
			TokenFor: tokenFor, Logger: a.base, Registerer: a.reg,
		})
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
	ic := istio.Config{Transport: t, CertSigner: c.CertSigner, Logger: a.base, Registerer: a.reg}
	if a.nodeMode() {
		// The token is the agent's own: pods' certificates are asked on
		// their behalf (ImpersonatedIdentity).
		if ic.Identity, err = c.Identity(); err != nil {
			return nil, configError{err}
		}
	}
	return istio.New(ic)
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
func (a *agent) fileSource(dir, source string) (certSource, error) {
	rootFeed, err := a.rootFeed(source+"_root", filepath.Join(dir, rootCertFile))
	if err != nil {
		return certSource{}, err
	}
	m, cs, err := a.startManager(a.managerConfig(pki.Identity{}, rootFeed.Roots(), source), nil)
	if err != nil {
		return certSource{}, err
	}
	pairFeed, err := certfile.NewPairFeed(certfile.PairFeedConfig{
		CertPath: filepath.Join(dir, certChainFile), KeyPath: filepath.Join(dir, keyFile),
		Label: source, Into: m, Source: a.fileConfig(),
	})
	if err != nil {
		return certSource{}, err
	}
	cs = append(cs,
		component{name: source + "_root_watcher", run: rootFeed.Run},
		component{name: source + "_watcher", run: pairFeed.Run})
	return certSource{manager: m, components: cs}, nil
}

func (a *agent) fileConfig() certfile.SourceConfig {
	return certfile.SourceConfig{Debounce: a.cfg.FileDebounce, Logger: a.base, Registerer: a.reg}
}

// rootFeed reads the root bundle at path (a file, or the system roots) for
// the setting name, to be followed while the agent runs.
func (a *agent) rootFeed(name, path string) (*certfile.RootFeed, error) {
	return certfile.NewRootFeed(certfile.RootFeedConfig{Name: name, Path: path, Source: a.fileConfig()})
}

// servingComponents are the local socket (SDS and, unless turned off, the
// SPIFFE Workload API), the xDS proxy, the OUTPUT_CERTS writer and the gRPC
// bootstrap writer, as configured, serving what src made.
func (a *agent) servingComponents(src certSource) ([]component, error) {
	c := a.cfg
	var cs []component
	m := src.manager
	if m != nil && !c.DisableEnvoy {
		// One count per pod of its SDS and Workload API streams.
		var streams streamlimit.Callers
		srv, err := sds.New(sds.Config{
			Secrets: m, MaxStreams: c.SDSMaxStreams, MaxStreamsPerCaller: c.SDSMaxStreamsPerPod, Callers: &streams,
			MaxFileNamesPerCaller: c.SDSMaxFileResourcesPerCaller,
			Logger:                a.base, Registerer: a.reg,
		})
		if err != nil {
			return nil, err
		}
		services := []func(*grpc.Server){srv.Register}
		if c.WorkloadAPI {
			wl, err := workloadapi.New(workloadapi.Config{Secrets: m, MaxStreams: c.WorkloadAPIMaxStreams,
				MaxStreamsPerCaller: c.SDSMaxStreamsPerPod, Callers: &streams, Logger: a.base, Registerer: a.reg})
			if err != nil {
				return nil, err
			}
			services = append(services, wl.Register)
		}
		var (
			resolver caller.Resolver
			dirMode  os.FileMode
		)
		if a.nodeMode() {
			// The directory is mounted into pods whose processes run as
			// any uid; the kernel, not the mode, says who they are.
			dirMode = 0o755
			r, nodeCs, err := a.nodeCallers(m)
			if err != nil {
				return nil, err
			}
			resolver = r
			cs = append(cs, nodeCs...)
		}
		socket, err := udsserver.New(a.withSocketLimits(udsserver.Config{
			SocketPath: c.SDSSocket, DirMode: dirMode, Replace: a.nodeMode(), Services: services, Resolver: resolver,
			MaxRecvBytes: c.SDSMaxRecvBytes, AllowedUIDs: c.SDSAllowedUIDs, Logger: a.base, Registerer: a.reg,
		}))
		if err != nil {
			return nil, err
		}
		a.localSocket.Store(socket)
		cs = append(cs, component{name: "sds", run: socket.Run})
	}
	if a.nodeMode() {
		if m == nil || c.DisableEnvoy {
			return nil, configError{errors.New("MESHAGENT_MODE=node needs a CA to sign the pods' certificates and the SDS socket to serve them")}
		}
		// Per-pod features: one agent serves many pods.
		a.log.Info("node mode: the xDS proxy, OUTPUT_CERTS and the gRPC bootstrap are per-pod features and are off")
		return cs, nil
	}
	if c.XDSProxy {
		xp, rootFeed, err := a.xdsProxy(src)
		if err != nil {
			return nil, err
		}
		a.status.AddReadiness("xds_upstream", xp.Ready)
		cs = append(cs, component{name: "xdsproxy", run: xp.Run})
		if rootFeed != nil {
			cs = append(cs, component{name: "xds_root_watcher", run: rootFeed.Run})
		}
	}
	if m != nil && c.OutputCerts != "" {
		w, err := outputcerts.New(outputcerts.Config{Dir: c.OutputCerts, Logger: a.base, Registerer: a.reg})
		if err != nil {
			return nil, err
		}
		sync, err := outputcerts.NewSync(outputcerts.SyncConfig{Secrets: m, Writer: w, Logger: a.base})
		if err != nil {
			return nil, err
		}
		cs = append(cs, component{name: "outputcerts", run: sync.Run})
	}
	if c.DisableEnvoy || settingSet(c, "GRPC_XDS_BOOTSTRAP") {
		cs = append(cs, component{name: "grpc_bootstrap", run: a.writeBootstrap, finite: true})
	}
	return cs, nil
}

// xdsProxy builds the proxy and, when the xDS root is a file of its own, the
// feed that follows it (SPEC 7). The proxy presents the workload certificate
// of src's manager to the control plane.
func (a *agent) xdsProxy(src certSource) (*xdsproxy.Proxy, *certfile.RootFeed, error) {
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
		rootFeed *certfile.RootFeed
	)
	if c.XDSRoot == c.CARoot && src.caRoots != nil {
		roots = src.caRoots
	} else if f, err := a.rootFeed("xds_root", c.XDSRoot); err == nil {
		roots, rootFeed = f.Roots(), f
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
	clientCert := workloadCertificate(nil)
	// With a manager, the connection made at start waits for the first
	// certificate: see xdsproxy.Config.ConnectAfter.
	var connectAfter <-chan struct{}
	if src.manager != nil {
		clientCert = workloadCertificate(src.manager)
		connectAfter = a.firstCert
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
			ClientCertificate: clientCert,
		},
		ConnectAfter: connectAfter,
		Logger:       a.base,
		Registerer:   a.reg,
	})
	if err != nil {
		return nil, nil, err
	}
	return xp, rootFeed, nil
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

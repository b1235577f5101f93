package app

import (
	"context"
	"errors"
	"fmt"
	"os"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/caclient/istio"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/files/grpcbootstrap"
	"github.com/meshagent/meshagent/internal/files/outputcerts"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/trust"
	"github.com/meshagent/meshagent/internal/uds/streamlimit"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/sds"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/workloadapi"
	"github.com/meshagent/meshagent/xdsproxy"
)

// servingComponents are what serves the certificates src made: the local
// socket's server, returned for Run to listen on (nil when another agent
// serves SDS or no Envoy runs), and, beside one workload, the per-workload
// outputs (sidecarOutputs), whose xDS proxy sends the token of tokens. In
// node mode, pods is the pod index.
func (a *App) servingComponents(src certSource, tokens tokenSource, pods *nodePods) (*udsserver.Server, []component, error) {
	var (
		socket *udsserver.Server
		cs     []component
	)
	if src.manager != nil && !a.s.DisableEnvoy {
		var err error
		if socket, cs, err = a.localSocket(src.manager, pods); err != nil {
			return nil, nil, err
		}
	}
	if pods != nil {
		a.log.Info("node mode: the xDS proxy, OUTPUT_CERTS and the gRPC bootstrap are per-pod features and are off")
		return socket, cs, nil
	}
	outputs, err := a.sidecarOutputs(src, tokens)
	if err != nil {
		return nil, nil, err
	}
	return socket, append(cs, outputs...), nil
}

// localSocket is the Unix socket serving SDS and, unless turned off, the
// SPIFFE Workload API from m, and the components it serves with. In node
// mode its callers are resolved to their pods (nodeCallers), its directory
// is open to every uid, and the pod index's hooks end and resolve again
// the connections of pods that leave and arrive.
func (a *App) localSocket(m *secretmanager.Manager, pods *nodePods) (*udsserver.Server, []component, error) {
	c := a.s
	// One count per pod of its SDS and Workload API streams.
	var streams streamlimit.Callers
	srv, err := sds.New(sds.Config{
		Secrets: m, MaxStreams: c.SDSMaxStreams, MaxStreamsPerCaller: c.SDSMaxStreamsPerPod, Callers: &streams,
		MaxFileNamesPerCaller: c.SDSMaxFileResourcesPerCaller,
		LimitNames:            streamlimit.Names{Max: "MESHAGENT_SDS_MAX_STREAMS", PerCaller: "MESHAGENT_SDS_MAX_STREAMS_PER_POD"},
		Clock:                 a.clock, Logger: a.base, Registerer: a.reg,
	})
	if err != nil {
		return nil, nil, settingError(err, sdsSettings)
	}
	services := []func(*grpc.Server){srv.Register}
	if c.WorkloadAPI {
		wl, err := workloadapi.New(workloadapi.Config{Secrets: m, MaxStreams: c.WorkloadAPIMaxStreams,
			MaxStreamsPerCaller: c.SDSMaxStreamsPerPod, Callers: &streams, Logger: a.base, Registerer: a.reg,
			LimitNames: streamlimit.Names{Max: "MESHAGENT_WORKLOAD_API_MAX_STREAMS", PerCaller: "MESHAGENT_SDS_MAX_STREAMS_PER_POD"}})
		if err != nil {
			return nil, nil, settingError(err, workloadAPISettings)
		}
		services = append(services, wl.Register)
	}
	if err := checkSocketPath("MESHAGENT_SDS_SOCKET", c.SDSSocket, a.nodeMode()); err != nil {
		return nil, nil, configError(err)
	}
	uc := a.withSocketLimits(udsserver.Config{
		SocketPath: c.SDSSocket, Replace: a.nodeMode(), Handoff: c.SocketHandoff, Services: services,
		MaxRecvBytes: c.SDSMaxRecvBytes, AllowedUIDs: c.SDSAllowedUIDs, Logger: a.base, Registerer: a.reg,
	})
	var cs []component
	if pods != nil {
		resolver, nodeCs, err := a.nodeCallers(pods, m)
		if err != nil {
			return nil, nil, err
		}
		uc.Resolver = resolver
		// The directory is mounted into pods whose processes run as any
		// uid; the kernel, not the mode, says who they are.
		uc.DirMode = 0o755
		cs = append(cs, nodeCs...)
	}
	socket, err := udsserver.New(uc)
	if err != nil {
		return nil, nil, settingError(err, socketSettings)
	}
	if pods != nil {
		pods.hooks.socket = socket
	}
	return socket, append(cs, component{name: "sds", run: socket.Run}), nil
}

// sidecarOutputs are what an agent beside one workload adds: the xDS
// proxy, the OUTPUT_CERTS writer and the gRPC bootstrap writer, as
// configured.
func (a *App) sidecarOutputs(src certSource, tokens tokenSource) ([]component, error) {
	c := a.s
	var cs []component
	if c.XDSProxy {
		if err := checkSocketPath("MESHAGENT_XDS_SOCKET", c.XDSSocket, false); err != nil {
			return nil, configError(err)
		}
		xp, rootFeed, err := a.xdsProxy(src, tokens)
		if err != nil {
			return nil, err
		}
		a.status.AddWorkloadReadiness("xds_upstream", xp.Ready)
		cs = append(cs, component{name: "xdsproxy", run: xp.Run})
		if rootFeed != nil {
			cs = append(cs, component{name: "xds_root_watcher", run: rootFeed.Run})
		}
	}
	bootstrap := c.DisableEnvoy || settingSet(c, "GRPC_XDS_BOOTSTRAP")
	if bootstrap {
		if err := checkFilePath("GRPC_XDS_BOOTSTRAP", c.GRPCXDSBootstrap); err != nil {
			return nil, configError(err)
		}
	}
	if bootstrap && (src.manager == nil || c.OutputCerts == "") {
		// The bootstrap's certificate provider would name files nobody
		// writes: proxyless gRPC would fail its first handshake.
		why := "OUTPUT_CERTS is empty"
		if src.manager == nil {
			why = "another agent serves SDS on " + c.SDSSocket + ", so this one writes no certificate files"
		}
		return nil, configError(fmt.Errorf("DISABLE_ENVOY/GRPC_XDS_BOOTSTRAP: the gRPC bootstrap needs certificate files but %s; "+
			"remove DISABLE_ENVOY and GRPC_XDS_BOOTSTRAP, or stop the other agent", why))
	}
	if src.manager != nil && c.OutputCerts != "" {
		w, err := outputcerts.New(a.outputCertsConfig())
		if err != nil {
			return nil, configError(settingError(err, outputSettings))
		}
		a.status.AddReadiness("output_certs", w.Healthy)
		hook, err := a.reloadHook()
		if err != nil {
			return nil, configError(err)
		}
		sync, err := outputcerts.NewSync(outputcerts.SyncConfig{
			Secrets: src.manager, Writer: w, Hook: hook, TrustDomain: a.bundleMapTrustDomain(), Logger: a.base, Clock: a.clock,
		})
		if err != nil {
			return nil, err
		}
		cs = append(cs, component{name: "outputcerts", run: sync.Run})
	}
	if bootstrap {
		cs = append(cs, component{name: "grpc_bootstrap", run: a.writeBootstrap, finite: true})
	}
	return cs, nil
}

// xdsProxy builds the proxy and, when the xDS root is a file of its own, the
// feed that follows it. The proxy presents the workload certificate
// of src's manager to the control plane, and the token of tokens.
func (a *App) xdsProxy(src certSource, tokens tokenSource) (*xdsproxy.Proxy, *certfile.RootFeed, error) {
	c := a.s
	md := map[string]string{}
	for k, v := range c.XDSHeaders {
		md[k] = v
	}
	if c.ClusterID != "" {
		md["ClusterID"] = c.ClusterID
	}
	var (
		roots    controlplane.RootSource
		rootFeed *certfile.RootFeed
	)
	if c.XDSRoot == c.CARoot && src.caRoots != nil {
		roots = src.caRoots
	} else if f, err := a.rootFeed("xds_root", c.XDSRoot); err == nil {
		roots, rootFeed = f.Roots(), f
	} else if settingSet(c, "XDS_ROOT_CA") {
		if inner := errors.Unwrap(err); inner != nil {
			err = inner // the feed's own wrapping repeats the path
		}
		return nil, nil, configError(fmt.Errorf("XDS_ROOT_CA=%s cannot be used: %w; set XDS_ROOT_CA to a PEM file of the control plane's root certificates, or SYSTEM", c.XDSRoot, err))
	} else {
		// Not fatal: the proxy then cannot verify the control plane and
		// says so at every attempt.
		a.log.Warn("xDS root not loaded; the control plane cannot be verified", zap.String(logkeys.Path, c.XDSRoot), zap.Error(err))
		roots = controlplane.StaticRoots{Pool: pki.CertPool(nil)}
	}
	token, err := tokens()
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
		Upstream: controlplane.Config{
			Addr:              c.DiscoveryAddress,
			ServerName:        c.IstiodSAN,
			Roots:             roots,
			Plaintext:         istio.PlaintextPort(c.DiscoveryAddress),
			Token:             token,
			TokenOptional:     true,
			Metadata:          md,
			ClientCertificate: a.xdsClientCert(token, clientCert),
			Policy:            c.CompliancePolicy,
		},
		ConnectAfter:  connectAfter,
		Subscriptions: a.xdsSubscriptions(src.proxyConfig),
		Clock:         a.clock,
		Logger:        a.base,
		Registerer:    a.reg,
	})
	if err != nil {
		return nil, nil, err
	}
	return xp, rootFeed, nil
}

// xdsSubscriptions are the xDS proxy's own subscriptions: istiod's
// ProxyConfig for its roots with PROXY_CONFIG_XDS_AGENT.
func (a *App) xdsSubscriptions(proxyConfig *trust.ProxyConfigSource) []xdsproxy.Subscription {
	if proxyConfig == nil {
		if a.s.ProxyConfigXDSAgent {
			a.log.Warn("PROXY_CONFIG_XDS_AGENT: this certificate source has no trust bundle; the ProxyConfig is not asked for")
		}
		return nil
	}
	return []xdsproxy.Subscription{{TypeURL: trust.ProxyConfigTypeURL, Apply: proxyConfig.Apply}}
}

// writeBootstrap writes the gRPC xDS bootstrap once (docs/vm.md).
func (a *App) writeBootstrap(context.Context) error {
	c := a.s
	ns := c.PodNamespace
	pod := c.PodName
	if pod == "" {
		pod, _ = os.Hostname()
	}
	_, err := grpcbootstrap.WriteFile(c.GRPCXDSBootstrap, grpcbootstrap.Config{
		XDSSocket:       c.XDSSocket,
		NodeID:          grpcbootstrap.SidecarNodeID(c.InstanceIP, pod, ns, ""),
		NodeMetadata:    map[string]any{"CLUSTER_ID": c.ClusterID, "NAMESPACE": ns},
		CertDir:         c.OutputCerts,
		SPIFFEBundleMap: c.OutputCerts != "" && a.bundleMapTrustDomain() != "",
		SecretTTL:       c.SecretTTL,
	})
	if err != nil {
		return fmt.Errorf("writing the gRPC bootstrap: %w", err)
	}
	a.log.Info("wrote the gRPC xDS bootstrap", zap.String(logkeys.Path, c.GRPCXDSBootstrap))
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

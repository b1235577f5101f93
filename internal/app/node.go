package app

import (
	"errors"
	"fmt"
	"path/filepath"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshagent/meshagent/brokerapi"
	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/csi"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/node/podcgroup"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/node/podresolver"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/secretmanager"
)

// nodePods is what node mode (docs/node-mode.md) builds first: the index of
// the node's pods, which names each pod's identity. The parts built after
// it read it: the CA client's token source (Linkerd), the socket's caller
// resolver, the Broker API and the Pod Certificates signer.
type nodePods struct {
	idx *podindex.Index
	// hooks are what idx calls as pods and identities come and go.
	hooks *podHooks
	// cgroupRoot is where the kubelet makes pod cgroups (from says how it
	// was found).
	cgroupRoot     podcgroup.Root
	cgroupRootFrom string
}

// podHooks are what the pod index calls as identities and pods come and
// go. They call parts built after the index (the manager, the socket, the
// Broker API), which need what needs the index: each field is set once by
// the builder of its part (nodeCallers, localSocket, brokerAPI) before New
// returns, and read only once Run runs the index, on its one event
// goroutine. A field not set (a part not built) is skipped.
type podHooks struct {
	// ahead holds and releases the certificates of identities whose pods
	// ask for them ahead.
	ahead *prefetcher
	// socket is the local socket's server: a pod's connections end when
	// it leaves, and those opened before it was known are resolved again
	// when it arrives.
	socket *udsserver.Server
	// broker is the Broker API's server: a pod's streams end when it
	// leaves. Nil when off.
	broker *brokerapi.Server
}

// podLeft is the pod index's PodLeft: the pod's connections to the local
// socket and its Broker API streams end, saying why.
func (h *podHooks) podLeft(p podindex.Pod, why string) {
	if h.socket != nil {
		h.socket.CallerLeft(p.UID, "pod "+p.String()+" "+why)
	}
	if h.broker != nil {
		h.broker.PodLeft(p.UID, "pod "+p.String()+" "+why)
	}
}

// podArrived is the pod index's PodArrived: a pod that asks, of an
// identity whose earlier pods did not, has it fetched ahead; connections
// accepted before the pod was known are resolved again.
func (h *podHooks) podArrived(p podindex.Pod) {
	if p.Prefetch && !p.Terminated() {
		h.fetch(p.Identity)
	}
	if h.socket != nil {
		h.socket.CallerArrived(p.UID)
	}
}

// fetch and release are the pod index's Handler: the certificate of an
// identity that arrives is fetched ahead when its pods ask (podIndex), and
// released when its last pod leaves.
func (h *podHooks) fetch(id pki.Identity) {
	if h.ahead != nil {
		h.ahead.fetch(id)
	}
}

func (h *podHooks) release(id pki.Identity) {
	if h.ahead != nil {
		h.ahead.release(id)
	}
}

// podIndex builds node mode's pod index, with the Kubernetes client kube
// makes.
func (a *App) podIndex(kube func() (*kubeclient.Client, error)) (*nodePods, error) {
	c := a.s
	client, err := kube()
	if err != nil {
		return nil, configError(fmt.Errorf("MESHAGENT_MODE=node: %w", err))
	}
	cgroupRoot, cgroupRootFrom, err := podresolver.CgroupRoot(c.NodeCgroupRoot, "/proc/self/cgroup")
	if err != nil {
		return nil, configError(fmt.Errorf("MESHAGENT_NODE_CGROUP_ROOT: %w", err))
	}
	hooks := &podHooks{}
	var idx *podindex.Index
	idx, err = podindex.New(podindex.Config{
		Pods:      client,
		NodeName:  c.NodeName,
		Scheme:    c.Scheme(),
		CSIDriver: csi.DriverName,
		Handler: podindex.HandlerFuncs{
			Added: func(id pki.Identity) {
				if c.NodePrefetchAll || idx.Prefetch(id) {
					hooks.fetch(id)
				}
			},
			Removed: hooks.release,
		},
		PodLeft:    hooks.podLeft,
		PodArrived: hooks.podArrived,
		Logger:     a.base,
		Registerer: a.reg,
	})
	if err != nil {
		return nil, err
	}
	return &nodePods{idx: idx, hooks: hooks, cgroupRoot: cgroupRoot, cgroupRootFrom: cgroupRootFrom}, nil
}

// checkNodeSource refuses a node agent whose certificate source is another
// agent's socket.
func (a *App) checkNodeSource() error {
	if a.nodeMode() && a.source.Source == SourceExternal {
		return fmt.Errorf("MESHAGENT_MODE=node needs a CA to sign the pods' certificates and the SDS socket to serve them: %s", a.source.Reason)
	}
	return nil
}

// fileResources reports whether file-cert: and file-root: resources are
// served. Node mode serves many pods from one socket: the node's files are
// not served, so one pod cannot read what is meant for another, unless the
// operator says every pod may read them.
func (a *App) fileResources() bool {
	if !a.nodeMode() {
		return true
	}
	if a.s.NodeFileResources {
		a.log.Warn("node mode: file-cert: and file-root: resources are served (MESHAGENT_NODE_FILE_RESOURCES): any pod on the node can read the files the agent can read")
	}
	return a.s.NodeFileResources
}

// prefetcher holds the identities fetched ahead. Certificates are fetched
// ahead only for identities whose pods ask for it (a pod that mounts the
// agent's CSI volume, or is annotated; all with MESHAGENT_NODE_PREFETCH_ALL);
// the others on their first request. An identity is fetched ahead when its
// first pod that asks arrives, and released when its last pod leaves. The
// pod index's handlers call it on the index's one event goroutine, so held
// needs no lock.
type prefetcher struct {
	m    *secretmanager.Manager
	log  *zap.Logger
	held map[pki.Identity]bool
}

func (p *prefetcher) fetch(id pki.Identity) {
	if p.held[id] {
		return
	}
	if err := p.m.Prefetch(id); err != nil {
		p.log.Warn("certificate not fetched ahead", zap.Stringer(logkeys.Identity, id), zap.Error(err))
		return
	}
	p.held[id] = true
}

func (p *prefetcher) release(id pki.Identity) {
	if p.held[id] {
		delete(p.held, id)
		p.m.Release(id)
	}
}

// nodeCallers connects the pod index to m, the manager: the arrivals and
// departures of identities hold and release their certificates in it. It
// returns the resolver that gives each socket caller its pod's identity,
// and the Broker API when it is served.
func (a *App) nodeCallers(pods *nodePods, m *secretmanager.Manager) (caller.Resolver, []component, error) {
	c := a.s
	pods.hooks.ahead = &prefetcher{m: m, log: a.base.Named("node"), held: map[pki.Identity]bool{}}
	r, err := podresolver.New(podresolver.Config{
		Pods:       pods.idx,
		CgroupRoot: pods.cgroupRoot,
		NodeUIDs:   c.NodeUIDIdentities,
		Logger:     a.base,
		Registerer: a.reg,
	})
	if err != nil {
		return nil, nil, err
	}
	if err := a.reportPods(pods.idx, m); err != nil {
		return nil, nil, err
	}
	a.log.Info("node mode: serving the pods of this node", zap.String(logkeys.Node, c.NodeName), zap.Int(logkeys.NodeUIDIdentities, len(c.NodeUIDIdentities)),
		zap.Stringer(logkeys.CgroupRoot, pods.cgroupRoot), zap.String(logkeys.CgroupRootFrom, pods.cgroupRootFrom))
	if c.BrokerSocket == "" {
		return r, nil, nil
	}
	b, err := a.brokerAPI(m, pods)
	if err != nil {
		return nil, nil, err
	}
	pods.hooks.broker = b
	return r, []component{{name: "broker_api", run: b.Run}}, nil
}

// reportPods shows the node's pods in the status port: the certificates
// each pod uses, their metrics, and the pod_index readiness check.
func (a *App) reportPods(idx *podindex.Index, m *secretmanager.Manager) error {
	podsOf := func() map[string][]string {
		ids := idx.Identities()
		out := make(map[string][]string, len(ids))
		for id, pods := range ids {
			out[id.String()] = pods
		}
		return out
	}
	a.status.AddCertLister(managerLister{m: m, pods: podsOf})
	if err := a.reg.Register(nodeIdentityCollector{m: m, pods: podsOf}); err != nil {
		return err
	}
	a.status.AddReadiness("pod_index", func() error {
		if !idx.HasSynced() {
			if err := idx.ListError(); err != nil {
				return fmt.Errorf("the node's pods are not listed yet: %w", err)
			}
			return errors.New("the node's pods are not listed yet (no answer from the API server so far)")
		}
		return nil
	})
	return nil
}

// PodsOf lists a service account's pods on the node from the pod index.
func (n *nodePods) PodsOf(namespace, serviceAccount string) []credfetcher.PodRef {
	pods := n.idx.PodsOf(namespace, serviceAccount)
	out := make([]credfetcher.PodRef, len(pods))
	for i, p := range pods {
		out[i] = credfetcher.PodRef{Name: p.Name, UID: types.UID(p.UID)}
	}
	return out
}

// linkerdTokens returns the token source of a node agent's Linkerd client:
// Linkerd's identity service has no impersonation, so each identity's CSR
// carries a token of that identity's own service account: the one the
// node's CSI driver was handed by the kubelet for one of its pods on this
// node (MESHAGENT_NODE_POD_TOKENS_DIR), found through pods. The agent
// creates no token.
func (a *App) linkerdTokens(pods *nodePods) (func(pki.Identity) (credfetcher.Fetcher, error), error) {
	c := a.s
	dir, err := filepath.Abs(c.NodePodTokensDir)
	if err != nil || c.NodePodTokensDir == "" {
		return nil, configError(fmt.Errorf("MESHAGENT_NODE_POD_TOKENS_DIR %q: want the directory the CSI driver hands the pods' tokens over in", c.NodePodTokensDir))
	}
	files := credfetcher.PodTokenFiles{Dir: dir, Pods: pods, Clock: a.clock}
	a.log.Info("node mode: each identity's CSR carries the token of one of its pods on this node, handed over by the CSI driver",
		zap.String(logkeys.Audience, c.CredentialIdentityProvider), zap.String(logkeys.Dir, dir))
	scheme := c.Scheme()
	return func(id pki.Identity) (credfetcher.Fetcher, error) {
		ns, sa, ok := scheme.Account(id)
		if !ok {
			return nil, fmt.Errorf("%s is not a service-account identity of %s", id, scheme)
		}
		return files.For(ns, sa)
	}, nil
}

// brokerAPI builds the SPIFFE Broker API server (docs/broker-api.md): the
// brokers' pid references are resolved as the socket's callers are, but a
// node process (MESHAGENT_NODE_UID_IDENTITIES) is never a broker's workload.
// Its socket has a directory of its own (internal/settings checks it).
func (a *App) brokerAPI(m *secretmanager.Manager, pods *nodePods) (*brokerapi.Server, error) {
	c := a.s
	if err := checkSocketPath("MESHAGENT_BROKER_SOCKET", c.BrokerSocket, true); err != nil {
		return nil, configError(err)
	}
	procs, err := podresolver.New(podresolver.Config{Pods: pods.idx, CgroupRoot: pods.cgroupRoot, Logger: a.base})
	if err != nil {
		return nil, err
	}
	brokers := make([]brokerapi.Broker, len(c.Brokers))
	for i, b := range c.Brokers {
		brokers[i] = brokerapi.Broker{ID: b.ID, PID: b.PID, Pod: b.Pod}
	}
	srv, err := brokerapi.New(brokerapi.Config{
		Socket: c.BrokerSocket, Brokers: brokers, Secrets: m, Processes: procs, Pods: pods.idx,
		MaxStreams: c.BrokerMaxStreams, MaxWorkloads: c.BrokerMaxWorkloads,
		MaxStreamsSetting: "MESHAGENT_BROKER_MAX_STREAMS", MaxWorkloadsSetting: "MESHAGENT_BROKER_MAX_WORKLOADS",
		Policy: c.CompliancePolicy, Clock: a.clock, Logger: a.base, Registerer: a.reg,
	})
	if err != nil {
		return nil, settingError(err, brokerSettings)
	}
	a.log.Info("node mode: serving the SPIFFE Broker API", zap.String(logkeys.Socket, c.BrokerSocket), zap.Int(logkeys.Brokers, len(brokers)))
	return srv, nil
}

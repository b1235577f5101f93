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
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/node/podcgroup"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/node/podresolver"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/secretmanager"
)

// nodeWiring is what node mode adds (docs/node-mode.md): one agent serves every pod
// of its node from one socket. The pod index names each pod's identity; its
// arrivals and departures hold and release certificates in the manager; the
// resolver gives each socket caller its pod's identity; with Linkerd, each
// identity's CSR carries a token of its own service account.
type nodeWiring struct {
	a *App
	// uids are node processes' identities (MESHAGENT_NODE_UID_IDENTITIES).
	uids map[uint32]pki.Identity
	// idx is the pod index, set by callers while New builds the socket.
	// The CA client is built before it; its token source calls PodsOf only
	// when a token is asked for, once Run runs, after New returned.
	idx *podindex.Index
	// broker serves the SPIFFE Broker API (MESHAGENT_BROKER_SOCKET); nil
	// when off. Set before the pod index runs.
	broker *brokerapi.Server
}

// checkNode checks node mode's settings, before anything is built.
func (a *App) checkNode() error {
	c := a.s
	if !a.nodeMode() {
		if c.BrokerSocket != "" {
			return errors.New("MESHAGENT_BROKER_SOCKET is served in node mode only (MESHAGENT_MODE=node): unset it")
		}
		return nil
	}
	if err := checkBroker(c); err != nil {
		return err
	}
	if c.NodeName == "" {
		return errors.New("MESHAGENT_MODE=node needs NODE_NAME: only the pods of this node are served")
	}
	if c.DisableEnvoy {
		return errors.New("MESHAGENT_MODE=node needs the SDS socket to serve the pods' certificates (DISABLE_ENVOY is set)")
	}
	uids, err := podresolver.ParseNodeUIDs(c.NodeUIDIdentities)
	if err != nil {
		return fmt.Errorf("MESHAGENT_NODE_UID_IDENTITIES: %w", err)
	}
	a.node = &nodeWiring{a: a, uids: uids}
	return nil
}

// checkNodeSource refuses a node agent whose certificate source is another
// agent's socket.
func (a *App) checkNodeSource() error {
	if a.node != nil && a.source.Source == SourceExternal {
		return fmt.Errorf("MESHAGENT_MODE=node needs a CA to sign the pods' certificates and the SDS socket to serve them: %s", a.source.Reason)
	}
	return nil
}

// fileResources reports whether file-cert: and file-root: resources are
// served. Node mode serves many pods from one socket: the node's files are
// not served, so one pod cannot read what is meant for another, unless the
// operator says every pod may read them.
func (n *nodeWiring) fileResources() bool {
	if n.a.s.NodeFileResources {
		n.a.log.Warn("node mode: file-cert: and file-root: resources are served (MESHAGENT_NODE_FILE_RESOURCES): any pod on the node can read the files the agent can read")
	}
	return n.a.s.NodeFileResources
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

// callers builds the pod index, whose arrivals and departures of identities
// hold and release their certificates in m, and the resolver that gives
// each socket caller its pod's identity.
func (n *nodeWiring) callers(m *secretmanager.Manager) (caller.Resolver, []component, error) {
	a, c := n.a, n.a.s
	kube, err := a.kubeClient()
	if err != nil {
		return nil, nil, configError(fmt.Errorf("MESHAGENT_MODE=node: %w", err))
	}
	cgroupRoot, cgroupRootFrom, err := podresolver.CgroupRoot(c.NodeCgroupRoot, "/proc/self/cgroup")
	if err != nil {
		return nil, nil, configError(fmt.Errorf("MESHAGENT_NODE_CGROUP_ROOT: %w", err))
	}
	ahead := &prefetcher{m: m, log: a.base.Named("node"), held: map[pki.Identity]bool{}}
	var idx *podindex.Index
	idx, err = podindex.New(podindex.Config{
		Pods:      kube,
		NodeName:  c.NodeName,
		Scheme:    c.Scheme(),
		CSIDriver: csi.DriverName,
		Handler: podindex.HandlerFuncs{
			Added: func(id pki.Identity) {
				if c.NodePrefetchAll || idx.Prefetch(id) {
					ahead.fetch(id)
				}
			},
			Removed: ahead.release,
		},
		PodLeft: func(p podindex.Pod, why string) {
			a.podLeft(p, why)
			if n.broker != nil {
				n.broker.PodLeft(p.UID, "pod "+p.String()+" "+why)
			}
		},
		PodArrived: func(p podindex.Pod) {
			// A pod that asks, of an identity whose earlier pods did not.
			if p.Prefetch && !p.Terminated() {
				ahead.fetch(p.Identity)
			}
			a.podArrived(p)
		},
		Logger:     a.base,
		Registerer: a.reg,
	})
	if err != nil {
		return nil, nil, err
	}
	n.idx = idx
	r, err := podresolver.New(podresolver.Config{
		Pods:       idx,
		CgroupRoot: cgroupRoot,
		NodeUIDs:   n.uids,
		Logger:     a.base,
		Registerer: a.reg,
	})
	if err != nil {
		return nil, nil, err
	}
	if err := n.report(idx, m); err != nil {
		return nil, nil, err
	}
	a.log.Info("node mode: serving the pods of this node", zap.String(logkeys.Node, c.NodeName), zap.Int(logkeys.NodeUIDIdentities, len(n.uids)),
		zap.Stringer(logkeys.CgroupRoot, cgroupRoot), zap.String(logkeys.CgroupRootFrom, cgroupRootFrom))
	cs := []component{{name: "pod_index", run: idx.Run}}
	if c.BrokerSocket != "" {
		b, err := n.brokerAPI(m, idx, cgroupRoot)
		if err != nil {
			return nil, nil, err
		}
		cs = append(cs, component{name: "broker_api", run: b.Run})
	}
	return r, cs, nil
}

// report shows the node's pods in the status port: the certificates each
// pod uses, their metrics, and the pod_index readiness check.
func (n *nodeWiring) report(idx *podindex.Index, m *secretmanager.Manager) error {
	a := n.a
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

// PodsOf lists a service account's pods on the node from the pod index;
// before the index is built it lists none.
func (n *nodeWiring) PodsOf(namespace, serviceAccount string) []credfetcher.PodRef {
	idx := n.idx
	if idx == nil {
		return nil
	}
	pods := idx.PodsOf(namespace, serviceAccount)
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
// node (MESHAGENT_NODE_POD_TOKENS_DIR). The agent creates no token.
func (n *nodeWiring) linkerdTokens() (func(pki.Identity) (credfetcher.Fetcher, error), error) {
	a, c := n.a, n.a.s
	dir, err := filepath.Abs(c.NodePodTokensDir)
	if err != nil || c.NodePodTokensDir == "" {
		return nil, configError(fmt.Errorf("MESHAGENT_NODE_POD_TOKENS_DIR %q: want the directory the CSI driver hands the pods' tokens over in", c.NodePodTokensDir))
	}
	files := credfetcher.PodTokenFiles{Dir: dir, Pods: n, Clock: a.clock}
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

// checkBroker checks the Broker API's settings: its socket in a directory
// of its own (the SDS socket's is mounted into every pod), and brokers
// listed when it is served.
func checkBroker(c *settings.Config) error {
	if c.BrokerSocket == "" {
		return nil
	}
	if err := checkSocketPath("MESHAGENT_BROKER_SOCKET", c.BrokerSocket, true); err != nil {
		return err
	}
	bdir, _ := filepath.Abs(filepath.Dir(c.BrokerSocket))
	sdir, _ := filepath.Abs(filepath.Dir(c.SDSSocket))
	if bdir == sdir {
		return fmt.Errorf("MESHAGENT_BROKER_SOCKET=%s is in the SDS socket's directory, which every pod mounts: give it a directory of its own, mounted only into the brokers' pods", c.BrokerSocket)
	}
	if len(c.Brokers) == 0 {
		return errors.New("MESHAGENT_BROKER_SOCKET is set but MESHAGENT_BROKERS lists no broker: list the brokers' SPIFFE IDs, or unset MESHAGENT_BROKER_SOCKET")
	}
	return nil
}

// brokerAPI builds the SPIFFE Broker API server (docs/broker-api.md): the
// brokers' pid references are resolved as the socket's callers are, but a
// node process (MESHAGENT_NODE_UID_IDENTITIES) is never a broker's workload.
func (n *nodeWiring) brokerAPI(m *secretmanager.Manager, idx *podindex.Index, cgroupRoot podcgroup.Root) (*brokerapi.Server, error) {
	a, c := n.a, n.a.s
	procs, err := podresolver.New(podresolver.Config{Pods: idx, CgroupRoot: cgroupRoot, Logger: a.base})
	if err != nil {
		return nil, err
	}
	brokers := make([]brokerapi.Broker, len(c.Brokers))
	for i, b := range c.Brokers {
		brokers[i] = brokerapi.Broker{ID: b.ID, PID: b.PID, Pod: b.Pod}
	}
	srv, err := brokerapi.New(brokerapi.Config{
		Socket: c.BrokerSocket, Brokers: brokers, Secrets: m, Processes: procs, Pods: idx,
		MaxStreams: c.BrokerMaxStreams, MaxWorkloads: c.BrokerMaxWorkloads,
		MaxStreamsSetting: "MESHAGENT_BROKER_MAX_STREAMS", MaxWorkloadsSetting: "MESHAGENT_BROKER_MAX_WORKLOADS",
		Policy: c.CompliancePolicy, Clock: a.clock, Logger: a.base, Registerer: a.reg,
	})
	if err != nil {
		return nil, settingError(err, brokerSettings)
	}
	n.broker = srv
	a.log.Info("node mode: serving the SPIFFE Broker API", zap.String(logkeys.Socket, c.BrokerSocket), zap.Int(logkeys.Brokers, len(brokers)))
	return srv, nil
}

package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.uber.org/zap"

	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/node/podresolver"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/uds/caller"
	"github.com/meshagent/meshagent/secretmanager"
)

// nodeMode reports whether the agent serves every pod of its node (SPEC 15).
func (a *agent) nodeMode() bool { return a.cfg.Mode == settings.ModeNode }

// nodeCallers builds node mode's pod index, whose arrivals and departures of
// identities hold and release their certificates in m, and the resolver
// that gives each socket caller its pod's identity.
func (a *agent) nodeCallers(m *secretmanager.Manager) (caller.Resolver, []component, error) {
	c := a.cfg
	if c.NodeName == "" {
		return nil, nil, configError{errors.New("MESHAGENT_MODE=node needs NODE_NAME: only the pods of this node are served")}
	}
	uids, err := podresolver.ParseNodeUIDs(c.NodeUIDIdentities)
	if err != nil {
		return nil, nil, configError{fmt.Errorf("MESHAGENT_NODE_UID_IDENTITIES: %w", err)}
	}
	td, err := spiffeid.TrustDomainFromString(c.TrustDomain)
	if err != nil {
		return nil, nil, configError{fmt.Errorf("TRUST_DOMAIN: %w", err)}
	}
	kube, err := kubeclient.New(kubeclient.Config{Kubeconfig: c.Kubeconfig, UserAgent: "meshagent/" + version})
	if err != nil {
		return nil, nil, configError{fmt.Errorf("MESHAGENT_MODE=node: %w", err)}
	}
	identity := func(ns, sa string) pki.Identity {
		if c.CAProvider == settings.ProviderLinkerd {
			return pki.LinkerdIdentity(c.TrustDomain, ns, sa, c.LinkerdNamespace)
		}
		return pki.SPIFFEIdentity(c.TrustDomain, ns, sa)
	}
	// The index names identities by SPIFFE ID: spiffe://<td>/ns/<ns>/sa/<sa>.
	of := func(id spiffeid.ID) pki.Identity {
		seg := strings.Split(strings.TrimPrefix(id.Path(), "/"), "/")
		return identity(seg[1], seg[3])
	}
	log := a.base.Named("node")
	idx, err := podindex.New(podindex.Config{
		Pods:        kube,
		NodeName:    c.NodeName,
		TrustDomain: td,
		Handler: podindex.HandlerFuncs{
			Added: func(id spiffeid.ID) {
				if err := m.Prefetch(of(id)); err != nil {
					log.Warn("certificate not fetched ahead", zap.Stringer(keyIdentity, id), zap.Error(err))
				}
			},
			Removed: func(id spiffeid.ID) {
				m.Release(of(id))
				a.dropNodeTokens(of(id))
			},
		},
		PodLeft:    a.podLeft,
		Logger:     a.base,
		Registerer: a.reg,
	})
	if err != nil {
		return nil, nil, err
	}
	a.nodePods.idx.Store(idx)
	r, err := podresolver.New(podresolver.Config{
		Pods:       idx,
		NodeUIDs:   uids,
		IdentityOf: func(ns, sa string) string { return identity(ns, sa).String() },
		Logger:     a.base,
		Registerer: a.reg,
	})
	if err != nil {
		return nil, nil, err
	}
	podsOf := func() map[string][]string {
		ids := idx.Identities()
		out := make(map[string][]string, len(ids))
		for id, pods := range ids {
			out[of(id).String()] = pods
		}
		return out
	}
	a.status.AddCertLister(managerLister{m: m, pods: podsOf})
	if err := a.reg.Register(nodeIdentityCollector{m: m, pods: podsOf}); err != nil {
		return nil, nil, err
	}
	a.status.AddReadiness("pod_index", func() error {
		if !idx.HasSynced() {
			return errors.New("the node's pods are not listed yet")
		}
		return nil
	})
	a.log.Info("node mode: serving the pods of this node", zap.String(keyNode, c.NodeName), zap.Int(keyNodeUIDs, len(uids)))
	return r, []component{{name: "pod_index", run: idx.Run}}, nil
}

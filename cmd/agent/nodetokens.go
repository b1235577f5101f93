package main

import (
	"fmt"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/settings"
)

// nodePods lists a service account's pods on the node from the pod index,
// which is built after the CA client: until then it lists none.
type nodePods struct {
	idx atomic.Pointer[podindex.Index]
}

func (n *nodePods) PodsOf(namespace, serviceAccount string) []credfetcher.PodRef {
	idx := n.idx.Load()
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

// linkerdNodeTokens returns the token source of a node agent's Linkerd
// client: Linkerd's identity service has no impersonation, so each
// identity's CSR carries a token of that identity's own service account,
// bound to one of its pods on this node.
func (a *agent) linkerdNodeTokens() (func(pki.Identity) (credfetcher.Fetcher, error), error) {
	c := a.cfg
	kube, err := kubeclient.New(kubeclient.Config{Kubeconfig: c.Kubeconfig, UserAgent: "meshagent/" + version})
	if err != nil {
		return nil, configError{fmt.Errorf("MESHAGENT_MODE=node with CA_PROVIDER=Linkerd: %w", err)}
	}
	pt, err := credfetcher.NewPodTokens(credfetcher.PodTokensConfig{
		Client:       kube,
		Pods:         &a.nodePods,
		Audiences:    strings.Split(c.CredentialIdentityProvider, ","),
		Lifetime:     c.TokenLifetime,
		RefreshRatio: c.TokenRefreshRatio,
		Logger:       a.base,
	})
	if err != nil {
		return nil, configError{err}
	}
	a.podTokens = pt
	a.log.Info("node mode: each identity's CSR carries a token of its own service account, bound to one of its pods on this node",
		zap.String(keyAudience, c.CredentialIdentityProvider), zap.Duration(keyLifetime, c.TokenLifetime))
	return func(id pki.Identity) (credfetcher.Fetcher, error) {
		ns, sa, ok := c.Scheme().Account(id)
		if !ok {
			return nil, fmt.Errorf("%s is not a Linkerd service-account identity of trust domain %s", id, c.TrustDomain)
		}
		return pt.For(ns, sa)
	}, nil
}

// dropNodeTokens forgets the tokens of a released identity's account.
func (a *agent) dropNodeTokens(id pki.Identity) {
	if a.podTokens == nil || a.cfg.CAProvider != settings.ProviderLinkerd {
		return
	}
	if ns, sa, ok := a.cfg.Scheme().Account(id); ok {
		a.podTokens.Drop(ns, sa)
	}
}

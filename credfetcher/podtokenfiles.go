package credfetcher

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/node/podtokens"
)

// ErrNoPod is returned by a PodTokenFiles fetcher when the service account
// has no pod on the node.
var ErrNoPod = errors.New("no pod of the service account on the node")

// PodRef names a pod of the node.
type PodRef struct {
	Name string
	UID  types.UID
}

// PodLister lists the pods of a service account on the agent's node.
type PodLister interface {
	PodsOf(namespace, serviceAccount string) []PodRef
}

// PodTokenFiles gives a node agent that asks the CA on behalf of other
// workloads (node mode with a CA that has no impersonation, such as
// Linkerd's) each service account's own token: the one the node's CSI
// driver was handed by the kubelet for a pod of the account on the node
// (internal/node/podtokens). The agent creates no token: a node holds the
// tokens of its own pods only.
type PodTokenFiles struct {
	// Dir is the directory the CSI driver writes the pods' tokens into.
	Dir string
	// Pods lists the account's pods on the node, best first.
	Pods PodLister
	// Clock tells an expired token. Nil means the real clock.
	Clock clock.PassiveClock
}

// For returns the token fetcher of namespace/serviceAccount. It reads the
// files at every call (the driver replaces them when the kubelet refreshes
// a token) and keeps nothing.
func (p PodTokenFiles) For(namespace, serviceAccount string) (Fetcher, error) {
	if p.Dir == "" || p.Pods == nil {
		return nil, errors.New("pod token files: no directory or no pod lister")
	}
	return podTokenFile{p: p, namespace: namespace, serviceAccount: serviceAccount}, nil
}

type podTokenFile struct {
	p                         PodTokenFiles
	namespace, serviceAccount string
}

// Token returns the token of the first of the account's pods on the node
// whose token was handed over and has not expired.
func (f podTokenFile) Token(context.Context) (string, error) {
	pods := f.p.Pods.PodsOf(f.namespace, f.serviceAccount)
	if len(pods) == 0 {
		return "", fmt.Errorf("serviceaccount %s/%s: %w", f.namespace, f.serviceAccount, ErrNoPod)
	}
	var now clock.PassiveClock = clock.RealClock{}
	if f.p.Clock != nil {
		now = f.p.Clock
	}
	var errs []error
	for _, pod := range pods {
		tok, err := podtokens.Read(f.p.Dir, string(pod.UID))
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", pod.Name, err))
			continue
		}
		if !tok.ExpirationTimestamp.After(now.Now()) {
			errs = append(errs, fmt.Errorf("pod %s: token expired at %s (the kubelet republishes the volume with a fresh one)", pod.Name, tok.ExpirationTimestamp))
			continue
		}
		return tok.Token, nil
	}
	return "", fmt.Errorf("%w: serviceaccount %s/%s: no token of its %d pod(s) on the node from the CSI driver: %w",
		ErrNoToken, f.namespace, f.serviceAccount, len(pods), errors.Join(errs...))
}

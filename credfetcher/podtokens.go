package credfetcher

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// ErrNoPod is returned by PodTokens.For when the service account has no pod
// to bind a token to.
var ErrNoPod = errors.New("no pod of the service account to bind a token to")

// PodRef names a pod a token may be bound to.
type PodRef struct {
	Name string
	UID  types.UID
}

// PodLister lists the pods of a service account that tokens may be bound to,
// best first (node mode: the account's pods on the agent's node).
type PodLister interface {
	PodsOf(namespace, serviceAccount string) []PodRef
}

// PodTokensConfig describes a PodTokens. The fields mean what they mean in
// TokenRequestConfig.
type PodTokensConfig struct {
	Client         TokenCreator
	Pods           PodLister
	Audiences      []string
	Lifetime       time.Duration
	RefreshRatio   float64
	RequestTimeout time.Duration
	Clock          clock.PassiveClock
	Logger         *zap.Logger
}

// PodTokens keeps one TokenRequest fetcher per service account, for an agent
// that asks the CA on behalf of other workloads (node mode with a CA that
// has no impersonation, such as Linkerd's): each account's tokens are its
// own, bound to one of its pods. The fetcher of an account is made on the
// first For and kept while its pod is listed; when that pod is gone, the
// next For binds a new fetcher to another pod of the account. Drop forgets
// an account (its identity is released). Tokens are in memory only.
//
// Safe for concurrent use; one mutex guards the map and is not held while
// the pod lister is called.
type PodTokens struct {
	cfg PodTokensConfig

	mu    sync.Mutex
	byAcc map[account]*boundFetcher
}

type account struct{ namespace, serviceAccount string }

type boundFetcher struct {
	pod PodRef
	f   *TokenRequest
}

// NewPodTokens checks cfg and returns an empty PodTokens.
func NewPodTokens(cfg PodTokensConfig) (*PodTokens, error) {
	if cfg.Pods == nil {
		return nil, errors.New("pod tokens: no pod lister")
	}
	// The rest is checked by NewTokenRequest; check it once here with a
	// placeholder account so a bad setting fails at start-up.
	probe := cfg.tokenRequestConfig(account{"ns", "sa"}, PodRef{Name: "pod"})
	if _, err := NewTokenRequest(probe); err != nil {
		return nil, err
	}
	return &PodTokens{cfg: cfg, byAcc: map[account]*boundFetcher{}}, nil
}

func (c PodTokensConfig) tokenRequestConfig(a account, pod PodRef) TokenRequestConfig {
	return TokenRequestConfig{
		Client:         c.Client,
		Namespace:      a.namespace,
		ServiceAccount: a.serviceAccount,
		PodName:        pod.Name,
		PodUID:         pod.UID,
		Audiences:      c.Audiences,
		Lifetime:       c.Lifetime,
		RefreshRatio:   c.RefreshRatio,
		RequestTimeout: c.RequestTimeout,
		Clock:          c.Clock,
		Logger:         c.Logger,
	}
}

// For returns the token fetcher of namespace/serviceAccount, bound to one of
// its listed pods: the current one while it is listed, else the first
// listed. With no pod listed it returns ErrNoPod.
func (p *PodTokens) For(namespace, serviceAccount string) (Fetcher, error) {
	pods := p.cfg.Pods.PodsOf(namespace, serviceAccount)
	a := account{namespace, serviceAccount}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.byAcc[a]; ok {
		for _, pod := range pods {
			if pod == cur.pod {
				return cur.f, nil
			}
		}
	}
	if len(pods) == 0 {
		delete(p.byAcc, a)
		return nil, fmt.Errorf("serviceaccount %s/%s: %w", namespace, serviceAccount, ErrNoPod)
	}
	f, err := NewTokenRequest(p.cfg.tokenRequestConfig(a, pods[0]))
	if err != nil {
		return nil, err
	}
	p.byAcc[a] = &boundFetcher{pod: pods[0], f: f}
	return f, nil
}

// Drop forgets the fetcher of namespace/serviceAccount and its token.
func (p *PodTokens) Drop(namespace, serviceAccount string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byAcc, account{namespace, serviceAccount})
}

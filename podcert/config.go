package podcert

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/backoff"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/secretmanager"
)

// Defaults of the Config fields no setting configures. TTL, RefreshRatio,
// RefreshJitter and Workers follow settings and have no default here.
const (
	DefaultMaxAttempts  = 8
	DefaultPodWait      = time.Minute
	DefaultCABackdate   = time.Minute
	DefaultBundleResync = 10 * time.Minute
)

// API is the part of the Kubernetes API the signer uses
// (kubeclient.Certificates).
type API interface {
	// PodCertificateRequestListWatch lists and watches the requests that
	// match fieldSelector, in every namespace.
	PodCertificateRequestListWatch(fieldSelector string) cache.ListerWatcher
	// UpdatePodCertificateRequestStatus writes a request's status.
	UpdatePodCertificateRequestStatus(ctx context.Context, req *kubeclient.PodCertificateRequest) (*kubeclient.PodCertificateRequest, error)
}

// CA signs the pods' CSRs through the agent's one signing pipeline
// (secretmanager.Manager.SignCSR): its CSR budget, its per-identity
// backoff (a failure is a *secretmanager.BackoffError) and its checks of
// every CA answer.
type CA interface {
	SignCSR(ctx context.Context, job secretmanager.CSRJob) (secretmanager.Signed, error)
}

// Pods finds the pods of the agent's node by UID (podindex.Index).
type Pods interface {
	Get(uid string) (podindex.Pod, bool)
	// HasSynced reports whether the node's pods have been listed once:
	// before, a pod missing from the index proves nothing.
	HasSynced() bool
}

// RootSource is the mesh's current trust bundle and its changes
// (secretmanager.Roots).
type RootSource interface {
	Bundle() (*pki.Bundle, string)
	Watch() (<-chan struct{}, func())
}

// Config describes a Signer. Zero values get the defaults noted; the
// fields without one are required.
type Config struct {
	// SignerName is the signer the agent implements, e.g.
	// meshagent.io/workload-identity: requests naming another signer are
	// left alone. Required.
	SignerName string
	// NodeName is the agent's node: only requests with spec.nodeName equal
	// to it are listed (a field selector), and only for pods the agent's pod
	// index holds. Required.
	NodeName string
	// API lists the node's requests and writes their status. Required.
	API API
	// Pods holds the node's pods; a request is signed only for a pod of the
	// node with the request's UID, name, namespace and service account.
	// Required.
	Pods Pods
	// Roots is the mesh's trust bundle: every answer must chain to it.
	// Required.
	Roots RootSource
	// CA signs. Required unless Refuse is set.
	CA CA
	// Refuse, when set, denies every request with this message (reason
	// UnsupportedCA): the CA cannot sign a kubelet's stub CSR (Linkerd's
	// identity service wants the identity in the CSR).
	Refuse string
	// TTL is the life asked of the CA, raised to one hour and capped at
	// each request's maxExpirationSeconds. Required.
	TTL time.Duration
	// CABackdate is how far the CA is expected to move NotBefore into the
	// past (istiod and the test CA: a minute). It is subtracted from the
	// validity asked, so the certificate does not outlive the request's
	// maximum; every answer corrects it. Default 1m; negative means 0.
	CABackdate time.Duration
	// RefreshRatio is the share of life left at beginRefreshAt, in (0, 1).
	// Required.
	RefreshRatio float64
	// RefreshJitter moves beginRefreshAt by up to this share of the life
	// either way, in [0, 1]; zero means none.
	RefreshJitter float64
	// Workers is how many requests are worked on at once; the CA's budget
	// is CA's. Required.
	Workers int
	// BackoffBase and BackoffCap: the wait after a failed status write of
	// a request doubles per failure, with jitter. Zero means
	// backoff.Default's.
	BackoffBase, BackoffCap time.Duration
	// MaxAttempts is how many rejected CA answers (a certificate that fails
	// the checks) a PodCertificateRequest gets before it is marked Failed.
	// A CA that cannot answer is retried while the request is pending.
	// Default 8.
	MaxAttempts int
	// PodWait is how long a request for a pod the index does not hold is
	// retried before it is denied (the pod informer may lag the kubelet),
	// counted from the request's creation or from the first full list of
	// the node's pods, whichever is later: a request that waited while the
	// agent was down is never denied for a pod list still on its way.
	// Default 1m.
	PodWait time.Duration
	// Clock times backoff, retries and validity. Default the real clock.
	Clock clock.WithTicker
	// Rand returns uniform numbers in [0, 1) for the jitters. Default
	// math/rand/v2.Float64. It must be safe for concurrent use.
	Rand func() float64
	// Logger receives the signer's logs. Nil means no logs.
	Logger *zap.Logger
	// Registerer receives the metrics. Nil means they are not registered.
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() error {
	var missing []string
	for name, unset := range map[string]bool{
		"SignerName": c.SignerName == "", "NodeName": c.NodeName == "", "API": c.API == nil,
		"Pods": c.Pods == nil, "Roots": c.Roots == nil, "CA": c.CA == nil && c.Refuse == "",
	} {
		if unset {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		return fmt.Errorf("podcert: Config.%s required", strings.Join(missing, ", Config."))
	}
	if err := ValidateSignerName(c.SignerName); err != nil {
		return err
	}
	if c.TTL <= 0 {
		return fmt.Errorf("podcert: Config.TTL %s is not positive", c.TTL)
	}
	if !(c.RefreshRatio > 0 && c.RefreshRatio < 1) {
		return fmt.Errorf("podcert: Config.RefreshRatio %v is outside (0, 1)", c.RefreshRatio)
	}
	if !(c.RefreshJitter >= 0 && c.RefreshJitter <= 1) {
		return fmt.Errorf("podcert: Config.RefreshJitter %v is outside [0, 1]", c.RefreshJitter)
	}
	if c.Workers <= 0 {
		return fmt.Errorf("podcert: Config.Workers %d is not positive", c.Workers)
	}
	if c.CABackdate == 0 {
		c.CABackdate = DefaultCABackdate
	}
	c.CABackdate = max(c.CABackdate, 0)
	if c.BackoffBase <= 0 {
		c.BackoffBase = backoff.Default.Base
	}
	if c.BackoffCap <= 0 {
		c.BackoffCap = backoff.Default.Cap
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.PodWait <= 0 {
		c.PodWait = DefaultPodWait
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}

// ValidateSignerName checks the shape the API requires of a signer name:
// <domain>/<path>, not under kubernetes.io (reserved).
func ValidateSignerName(name string) error {
	domain, path, ok := strings.Cut(name, "/")
	switch {
	case !ok || domain == "" || path == "" || strings.Contains(domain, ":"):
		return fmt.Errorf("signer name %q: want <domain>/<name>, e.g. meshagent.io/workload-identity", name)
	case domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io"):
		return fmt.Errorf("signer name %q: the kubernetes.io domain is reserved", name)
	}
	return nil
}

// BundleName is the name of the ClusterTrustBundle holding the roots of
// signer: the API requires the signer name, with '/' replaced by ':', as a
// prefix.
func BundleName(signer string) string {
	return strings.ReplaceAll(signer, "/", ":") + ":mesh-roots"
}

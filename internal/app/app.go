package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/status"
	"github.com/meshagent/meshagent/internal/tlspolicy"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/secretmanager"
)

// Config is what New needs: the resolved settings, and the seams a test (or
// another program) replaces. Zero values get the defaults noted on each
// field.
type Config struct {
	// Settings is the resolved configuration; the App reads it and never
	// changes it. Required. Relative paths in it are relative to the
	// process's working directory.
	Settings *settings.Config
	// Logger is given to every component, which names its own; the App
	// logs under "agent". Nil means zap.NewNop().
	Logger *zap.Logger
	// Clock times every certificate expiry and renewal, retry backoff, file
	// debounce and token refresh, and is the "now" certificates are checked
	// against. Nil means the real clock.
	Clock clock.Clock
	// Registry receives every metric and is what the status server serves
	// on /stats/prometheus. Nil means a new registry with the Go and
	// process collectors.
	Registry *prometheus.Registry
	// KubeClient makes the Kubernetes API client, for node mode and
	// TokenRequest tokens; it is called at most once. Nil means
	// kubeclient.New with Settings.Kubeconfig.
	KubeClient func() (*kubeclient.Client, error)
	// OnStatusListen is called with the status server's address once it
	// listens (STATUS_PORT=0 picks a free port). Nil means nobody is told.
	OnStatusListen func(net.Addr)
	// Version is the agent's version, in its log, its meshagent_agent_info
	// metric and its user agent towards the API server. Empty means "dev".
	Version string
}

// ConfigError is a configuration New refuses: the settings, taken together,
// cannot make an agent. Nothing was started when New returns one.
type ConfigError struct{ Err error }

func (e ConfigError) Error() string { return e.Err.Error() }
func (e ConfigError) Unwrap() error { return e.Err }

// configError wraps err as a ConfigError.
func configError(err error) error { return ConfigError{Err: err} }

// App is the agent: every component the settings call for, built and
// checked, not yet running.
type App struct {
	cfg   Config
	s     *settings.Config
	clock clock.Clock
	// log is the App's own logger; base is given to components.
	log    *zap.Logger
	base   *zap.Logger
	reg    *prometheus.Registry
	status *status.Server
	source SourceDecision

	// What Run needs, set by New from what the builders return.
	components []component
	// preconnect, when set, starts the CA connection: the first thing Run
	// does (certSource.preconnect).
	preconnect func()
	// socket is the local socket's server, which Run listens on before
	// any component runs; nil when the agent serves no socket.
	socket *udsserver.Server

	// undo releases what New made, if New fails.
	undo []func()
	// firstCert is closed when the manager first publishes a workload
	// certificate (noteFirstCert).
	firstCert     chan struct{}
	firstCertOnce sync.Once

	ran atomic.Bool
}

// component is one long-running part of the agent.
type component struct {
	name string
	// run blocks until ctx ends (then returns nil) or the component fails.
	run func(ctx context.Context) error
	// finite components may finish with nil without stopping the agent (a
	// one-shot writer); any other component returning stops the agent.
	finite bool
}

// ErrRunning is returned by a second call of Run.
var ErrRunning = errors.New("the agent runs already (Run is called once)")

// New checks the configuration and builds every component. It starts
// nothing: no goroutine, socket, connection or file is made or changed until
// Run (it only reads the settings' files and probes the SDS socket to decide
// where certificates come from, and logs the decision). A configuration that
// cannot work is a ConfigError.
func New(cfg Config) (_ *App, err error) {
	if cfg.Settings == nil {
		return nil, configError(errors.New("app: no settings"))
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	a := &App{
		cfg:       cfg,
		s:         cfg.Settings,
		clock:     cfg.Clock,
		base:      cfg.Logger,
		log:       cfg.Logger.Named("agent"),
		reg:       cfg.Registry,
		firstCert: make(chan struct{}),
	}
	defer func() {
		if err != nil {
			for _, undo := range a.undo {
				undo()
			}
		}
	}()
	// internal/settings refused what the settings alone rule out; what
	// follows needs the certificate source.
	a.source = SelectSource(context.Background(), a.s)
	a.logStart(cfg.Version)
	if err := a.checkNodeSource(); err != nil {
		return nil, configError(err)
	}
	if err := a.registerInfo(cfg.Version); err != nil {
		return nil, err
	}
	a.status = status.New(status.Config{Addr: a.s.StatusAddr(), Gatherer: a.reg, Logger: a.base, OnListen: cfg.OnStatusListen})

	// Each part is built from what the parts before it returned. The
	// Kubernetes client and the bearer token source are made by the first
	// part that asks: a configuration that needs neither never makes them.
	kube := sync.OnceValues(a.newKubeClient)
	tokens := tokenSource(sync.OnceValues(func() (credfetcher.Fetcher, error) { return a.tokenFetcher(kube) }))
	var pods *nodePods
	if a.nodeMode() {
		if pods, err = a.podIndex(kube); err != nil {
			return nil, err
		}
		a.components = append(a.components, component{name: "pod_index", run: pods.idx.Run})
	}
	src, err := a.certificateSource(tokens, pods)
	if err != nil {
		return nil, err
	}
	a.components = append(a.components, src.components...)
	a.preconnect = src.preconnect
	socket, serving, err := a.servingComponents(src, tokens, pods)
	if err != nil {
		return nil, err
	}
	a.socket = socket
	a.components = append(a.components, serving...)
	podCerts, err := a.podCertificates(src, pods)
	if err != nil {
		return nil, err
	}
	a.components = append(a.components, podCerts...)
	a.components = append(a.components, component{name: "status", run: a.status.Run})
	return a, nil
}

// registerInfo registers meshagent_agent_info, in a new registry with the
// Go and process collectors when Config has none.
func (a *App) registerInfo(version string) error {
	if a.reg == nil {
		a.reg = prometheus.NewRegistry()
		a.reg.MustRegister(
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		)
	}
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "meshagent_agent_info",
		Help: "Always 1; labels carry the version, where certificates come from (source) and the mode (sidecar or node).",
	}, []string{"version", "source", "mode"})
	info.WithLabelValues(version, string(a.source.Source), a.s.Mode).Set(1)
	return a.reg.Register(info)
}

// logStart logs the start: the version, the mode, the certificate source
// and the TLS policy, then a warning for every setting that has no effect or
// is unknown.
func (a *App) logStart(version string) {
	a.log.Info("starting meshagent", zap.String(logkeys.Version, version), zap.String(logkeys.Mode, a.s.Mode),
		zap.String(logkeys.Source, string(a.source.Source)), zap.String(logkeys.Reason, a.source.Reason),
		zap.String(logkeys.CompliancePolicy, compliancePolicyName(a.s.CompliancePolicy)), zap.String(logkeys.CryptoModule, tlspolicy.Module()))
	if w := tlspolicy.Check(a.s.CompliancePolicy); w != "" {
		a.log.Warn(w)
	}
	for _, w := range a.s.Warnings() {
		a.log.Warn("setting has no effect", zap.String(logkeys.Setting, w.Name), zap.String(logkeys.Value, w.Value), zap.String(logkeys.Reason, w.Why))
	}
	for _, w := range a.s.Unknown() {
		a.log.Warn("unknown setting ignored", zap.String(logkeys.Setting, w.Name), zap.String(logkeys.Value, w.Value), zap.String(logkeys.Reason, w.Why))
	}
}

// Source is where the App's certificates come from, and why.
func (a *App) Source() SourceDecision { return a.source }

// Run runs every component until ctx ends, a loopback caller POSTs
// /quitquitquit (both return nil) or a component fails: the first failure
// stops the others and is returned with the component's name. Run is called
// once.
func (a *App) Run(ctx context.Context) error {
	if !a.ran.CompareAndSwap(false, true) {
		return ErrRunning
	}
	if a.preconnect != nil {
		// The handshakes with the CA then run while the servers start and
		// the key is made, not after them on the way to the first CSR.
		a.preconnect()
	}
	if a.source.StaleSocket {
		removeStaleSocket(ctx, a.log, a.s.SDSSocket)
	}
	if a.socket != nil {
		// Bound before any component runs, the status server included: a
		// ready agent always has its socket at its path (once the stale
		// one is gone), however the components' goroutines are scheduled.
		if err := a.socket.Listen(); err != nil {
			return fmt.Errorf("sds: %w", err)
		}
	}
	return runComponents(ctx, a.log, a.components)
}

// runComponents runs every component until the first one returns. A failure
// is returned with the component's name; a nil return (e.g. /quitquitquit)
// stops the others cleanly. Components stopped because another returned may
// report context.Canceled; that is not a failure.
func runComponents(ctx context.Context, log *zap.Logger, cs []component) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g errgroup.Group
	for _, c := range cs {
		g.Go(func() error {
			err := c.run(ctx)
			stopping := ctx.Err() != nil
			switch {
			case err == nil && c.finite && !stopping:
				log.Debug("component finished", zap.String(logkeys.Component, c.name))
				return nil
			case err == nil || (stopping && errors.Is(err, context.Canceled)):
				log.Debug("component stopped", zap.String(logkeys.Component, c.name))
				cancel()
				return nil
			}
			cancel()
			return fmt.Errorf("%s: %w", c.name, err)
		})
	}
	return g.Wait()
}

// noteFirstCert is the managers' OnPublish: it closes firstCert at the first
// workload certificate.
func (a *App) noteFirstCert(s *secretmanager.Secret) {
	if !s.IsRoot() {
		a.firstCertOnce.Do(func() { close(a.firstCert) })
	}
}

// newKubeClient makes the Kubernetes API client (Config.KubeClient). New
// makes it once, for every part that needs it.
func (a *App) newKubeClient() (*kubeclient.Client, error) {
	if a.cfg.KubeClient != nil {
		return a.cfg.KubeClient()
	}
	kube, err := kubeclient.New(kubeclient.Config{Kubeconfig: a.s.Kubeconfig, UserAgent: "meshagent/" + a.cfg.Version})
	if err != nil && a.s.Kubeconfig != "" {
		err = kubeconfigError(a.s.Kubeconfig, err)
	}
	return kube, err
}

// nodeMode reports whether the agent serves every pod of its node.
func (a *App) nodeMode() bool { return a.s.Mode == settings.ModeNode }

// compliancePolicyName is COMPLIANCE_POLICY as logged: "none" when unset.
func compliancePolicyName(p tlspolicy.Policy) string {
	if p == tlspolicy.None {
		return "none"
	}
	return string(p)
}

// kubeconfigError names KUBECONFIG and the fix in the error of a client made
// from it; a missing file says so rather than what client-go says of an
// empty configuration.
func kubeconfigError(path string, err error) error {
	if _, serr := os.Stat(path); serr != nil {
		err = serr
	}
	return fmt.Errorf("KUBECONFIG=%s cannot be used: %w; set KUBECONFIG to a readable kubeconfig file, or unset it in a pod to use its service account", path, err)
}

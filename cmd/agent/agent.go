package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/logging"
	"github.com/meshagent/meshagent/internal/settings"
	"github.com/meshagent/meshagent/internal/status"
	"github.com/meshagent/meshagent/internal/uds/sockprobe"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/secretmanager"
)

// component is one long-running part of the agent.
type component struct {
	name string
	// run blocks until ctx ends (then returns nil) or the component fails.
	run func(ctx context.Context) error
	// finite components may finish with nil without stopping the agent (a
	// one-shot writer); any other component returning stops the agent.
	finite bool
}

// agent holds what the components share while they are built.
type agent struct {
	cfg *settings.Config
	// log is the agent's own logger; base is given to components, which name their own.
	log    *zap.Logger
	base   *zap.Logger
	reg    *prometheus.Registry
	status *status.Server
	mode   ModeDecision
	// tokens is the bearer token source, built by tokenFetcher.
	tokens credfetcher.Fetcher
	// podTokens and nodePods: node mode with Linkerd, the tokens of each
	// service account with pods on the node (linkerdNodeTokens).
	podTokens *credfetcher.PodTokens
	nodePods  nodePods
	// firstCert is closed when the manager first publishes a workload
	// certificate of the agent's own identity (noteFirstCert).
	firstCert     chan struct{}
	firstCertOnce sync.Once
	// localSocket is the SDS socket's server, once built (podLeft).
	localSocket atomic.Pointer[udsserver.Server]
}

// noteFirstCert is the managers' OnPublish: it closes firstCert at the first
// workload certificate.
func (a *agent) noteFirstCert(s *secretmanager.Secret) {
	if !s.IsRoot() {
		a.firstCertOnce.Do(func() { close(a.firstCert) })
	}
}

// errSourceUnavailable: a mode without a certificate source (a mode added to
// selectMode but not to certificateSource).
var errSourceUnavailable = errors.New("no certificate source for this mode")

// runAgent runs the agent until ctx ends, SIGINT or SIGTERM arrives, a loopback
// caller POSTs /quitquitquit (all return nil) or a component fails.
func runAgent(ctx context.Context, cfg *settings.Config, stderr io.Writer, h hooks) error {
	base, err := logging.New(logging.Config{Level: cfg.LogLevel, Output: stderr})
	if err != nil {
		return configError{err}
	}
	defer func() { _ = base.Sync() }()
	defer logging.RouteKlog(base)() // client-go logs in the agent's format
	log := base.Named("agent")

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	mode := selectMode(ctx, cfg)
	log.Info("starting meshagent", zap.String(keyVersion, version), zap.String(keyMode, string(mode.Mode)), zap.String(keyReason, mode.Reason))
	for _, w := range cfg.Warnings() {
		log.Warn("setting has no effect", zap.String(keySetting, w.Name), zap.String(keyValue, w.Value), zap.String(keyReason, w.Why))
	}
	if mode.StaleSocket {
		removeStaleSocket(ctx, log, cfg.SDSSocket)
	}

	a := &agent{cfg: cfg, log: log, base: base, reg: newRegistry(mode), mode: mode, firstCert: make(chan struct{})}
	a.status = status.New(status.Config{Addr: cfg.StatusAddr(), Gatherer: a.reg, Logger: base, OnListen: h.statusListening})

	components, err := a.buildComponents()
	if err != nil {
		log.Error("agent cannot start", zap.Error(err))
		var ce configError
		if errors.As(err, &ce) {
			return err
		}
		return failureLogged{err}
	}
	if err := runComponents(ctx, log, components); err != nil {
		log.Error("agent stopped on a failure", zap.Error(err))
		return failureLogged{err}
	}
	log.Info("agent stopped")
	return nil
}

// buildComponents makes every component for the configuration. It is the one
// place where components are added: each appends itself to the list, and may
// register readiness and liveness checks and certificate listers with
// a.status. Components start nothing until run.
func (a *agent) buildComponents() ([]component, error) {
	var cs []component

	// The certificate source chosen at start-up (SPEC 5).
	source, err := a.certificateSource()
	if err != nil {
		return nil, err
	}
	cs = append(cs, source.components...)

	serving, err := a.servingComponents(source)
	if err != nil {
		return nil, err
	}
	cs = append(cs, serving...)

	cs = append(cs, component{name: "status", run: a.status.Run})
	return cs, nil
}

// certificateSource builds the secret manager and the components that
// produce workload certificates in the chosen mode.
func (a *agent) certificateSource() (certSource, error) {
	switch a.mode.Mode {
	case ModeDev:
		return a.devSource()
	case ModeExternal:
		a.status.AddReadiness("certificate_source", func() error { return nil })
		return certSource{}, nil
	case ModeCA:
		return a.caSource()
	case ModeWorkloadCredentials:
		return a.fileSource(a.cfg.WorkloadCredentialsDir, "workload-credentials")
	case ModeFileMounted:
		return a.fileSource(a.cfg.FileMountedCertsDir, "file-mounted")
	}
	return certSource{}, fmt.Errorf("%w: %s (%s)", errSourceUnavailable, a.mode.Mode, a.mode.Reason)
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
				log.Debug("component finished", zap.String(keyComponent, c.name))
				return nil
			case err == nil || (stopping && errors.Is(err, context.Canceled)):
				log.Debug("component stopped", zap.String(keyComponent, c.name))
				cancel()
				return nil
			}
			cancel()
			return fmt.Errorf("%s: %w", c.name, err)
		})
	}
	return g.Wait()
}

// removeStaleSocket deletes the socket at the SDS path if it still answers
// no gRPC dial (SPEC 5.1).
func removeStaleSocket(ctx context.Context, log *zap.Logger, path string) {
	removed, err := sockprobe.RemoveStale(ctx, path, sdsProbeTimeout, sockprobe.GRPC)
	if err != nil {
		log.Warn("cannot remove stale SDS socket", zap.String(keyPath, path), zap.Error(err))
		return
	}
	if removed {
		log.Info("removed stale SDS socket", zap.String(keyPath, path))
	}
}

// newRegistry makes the metrics registry every component registers with.
func newRegistry(mode ModeDecision) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "meshagent_agent_info",
		Help: "Always 1; labels carry the version and the certificate source mode.",
	}, []string{"version", "mode"})
	info.WithLabelValues(version, string(mode.Mode)).Set(1)
	reg.MustRegister(info)
	return reg
}

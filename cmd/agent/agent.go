package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/meshagent/meshagent/internal/app"
	"github.com/meshagent/meshagent/internal/drain"
	"github.com/meshagent/meshagent/internal/logging"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/memlimit"
	"github.com/meshagent/meshagent/internal/settings"
)

// runAgent runs the agent of cfg (package app) until ctx ends, SIGINT or
// SIGTERM arrives and the drain that follows ends (package drain), a
// loopback caller POSTs /quitquitquit (all return nil) or a component fails.
func runAgent(ctx context.Context, cfg *settings.Config, stderr io.Writer, h hooks) error {
	// Held until New has checked the configuration (heldWriter); released
	// on every path but a configuration error, which execute prints first.
	// The encoder is chosen by stderr itself (console on a terminal).
	held := &heldWriter{dst: stderr}
	console := logging.IsTerminal(stderr)
	base, err := logging.New(logging.Config{Level: cfg.LogLevel, Output: held, Console: &console})
	if err != nil {
		return configError(err)
	}
	defer func() { _ = base.Sync() }()
	defer logging.RouteKlog(base)() // client-go logs in the agent's format
	log := base.Named("agent")

	setMemoryLimit(log, "/", os.Getenv("GOMEMLIMIT"))

	// Received from here on, read once the agent runs: one starts the
	// drain, a second ends it.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ignoreHangup(ctx, log)

	a, err := app.New(app.Config{Settings: cfg, Logger: base, OnStatusListen: h.statusListening, Version: version})
	if err != nil {
		if errors.As(err, new(app.ConfigError)) {
			// One line, written by execute first: the setting and the
			// fix; the start-up log lines follow it.
			return &exitError{code: exitConfig, err: err, held: held}
		}
		held.release()
		log.Error("agent cannot start", zap.Error(err))
		return failureLogged(err)
	}
	held.release()
	ctx, stopDrain := drain.Context(ctx, sigs, drain.Config{Period: a.DrainPeriod(), Started: a.StartDrain, Logger: log})
	defer stopDrain()
	if err := a.Run(ctx); err != nil {
		log.Error("agent stopped on a failure", zap.Error(err))
		return failureLogged(err)
	}
	log.Info("agent stopped")
	return nil
}

// ignoreHangup keeps SIGHUP from stopping the agent until ctx ends
// (docs/operations.md): there is nothing to reload on it, since every
// file the agent reads is followed as it changes. Each SIGHUP is logged.
func ignoreHangup(ctx context.Context, log *zap.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-hup:
				log.Info("SIGHUP ignored: the files the agent reads are followed as they change, with nothing to reload")
			case <-ctx.Done():
				return
			}
		}
	}()
}

// setMemoryLimit gives Go a soft memory limit of 90 % of the container's
// cgroup limit (the cgroup files under root) unless gomemlimit, GOMEMLIMIT
// (the Go runtime's own variable, not a setting of the agent's), is set, as
// pilot-agent does, and logs what it did.
func setMemoryLimit(log *zap.Logger, root, gomemlimit string) {
	d := memlimit.Apply(root, gomemlimit)
	if d.Set == 0 {
		log.Info("no soft memory limit set from the cgroup", zap.String(logkeys.Reason, d.Why))
		return
	}
	log.Info("soft memory limit set from the cgroup", zap.Int64(logkeys.SoftMemoryLimit, d.Set), zap.Int64(logkeys.CgroupMemoryLimit, d.Limit), zap.String(logkeys.Path, d.From))
}

// Package drain turns the agent's stop signals into a drain, as pilot-agent
// drains Envoy (docs/operations.md, "Termination"): after the first SIGTERM
// or SIGINT the agent keeps serving for the drain period and then stops; a
// second signal stops it at once.
//
// It owns one goroutine, started by Context and ended by its stop function,
// and nothing else: the signal channel is the caller's (signal.Notify), and
// what "draining" means to readiness is the caller's Started callback.
package drain

import (
	"context"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/meshagent/meshagent/internal/logkeys"
)

// Config configures a drain.
type Config struct {
	// Period is how long the agent keeps serving after the first stop
	// signal. Zero (or less) stops it at the first signal.
	Period time.Duration
	// Started, when set, is called once, when the first signal arrives and
	// Period is not zero, before the period starts.
	Started func()
	// Logger; nil means no logging.
	Logger *zap.Logger
}

// Context returns a copy of parent that is cancelled when the agent is to
// stop: Period after the first signal received on signals, at once on a
// second one (or on the first when Period is zero), or when parent ends.
// The returned stop cancels the context and waits for Context's goroutine;
// call it when the agent has stopped. Start and end are logged.
func Context(parent context.Context, signals <-chan os.Signal, cfg Config) (ctx context.Context, stop func()) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		wait(ctx, signals, cfg)
	}()
	return ctx, func() { cancel(); <-done }
}

// wait returns when the agent is to stop (Context).
func wait(ctx context.Context, signals <-chan os.Signal, cfg Config) {
	log := cfg.Logger
	var sig os.Signal
	select {
	case <-ctx.Done():
		return
	case sig = <-signals:
	}
	if cfg.Period <= 0 {
		log.Info("stopping without a drain", zap.Stringer(logkeys.Signal, sig), zap.Duration(logkeys.Drain, 0))
		return
	}
	if cfg.Started != nil {
		cfg.Started()
	}
	log.Info("drain started: still serving, then stopping; a second signal stops at once",
		zap.Stringer(logkeys.Signal, sig), zap.Duration(logkeys.Drain, cfg.Period))
	t := time.NewTimer(cfg.Period)
	defer t.Stop()
	select {
	case <-t.C:
		log.Info("drain ended: stopping", zap.Duration(logkeys.Drain, cfg.Period))
	case sig = <-signals:
		log.Info("drain cut short by a second signal: stopping", zap.Stringer(logkeys.Signal, sig))
	case <-ctx.Done():
		// Stopped for another reason (/quitquitquit, a failure), which
		// is logged where it happens.
	}
}

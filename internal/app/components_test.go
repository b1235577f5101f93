package app

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meshagent/meshagent/internal/logkeys"
)

// blocker runs until ctx ends and counts how often it stopped.
func blocker(stopped *atomic.Int32) func(context.Context) error {
	return func(ctx context.Context) error {
		<-ctx.Done()
		stopped.Add(1)
		return nil
	}
}

func TestRunComponents(t *testing.T) {
	boom := errors.New("boom")
	t.Run("first failure stops the rest and is returned", func(t *testing.T) {
		var stopped atomic.Int32
		err := runComponents(context.Background(), zap.NewNop(), []component{
			{name: "a", run: blocker(&stopped)},
			{name: "failing", run: func(context.Context) error { return boom }},
			{name: "b", run: blocker(&stopped)},
		})
		if !errors.Is(err, boom) || err.Error() != "failing: boom" {
			t.Errorf("err = %v", err)
		}
		if stopped.Load() != 2 {
			t.Errorf("%d components stopped, want 2", stopped.Load())
		}
	})
	t.Run("a clean return stops the rest", func(t *testing.T) {
		var stopped atomic.Int32
		err := runComponents(context.Background(), zap.NewNop(), []component{
			{name: "a", run: blocker(&stopped)},
			{name: "quit", run: func(context.Context) error { return nil }},
		})
		if err != nil || stopped.Load() != 1 {
			t.Errorf("err %v, stopped %d", err, stopped.Load())
		}
	})
	t.Run("a finite component does not stop the rest", func(t *testing.T) {
		core, logs := observer.New(zapcore.DebugLevel)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ping := make(chan chan error)
		done := make(chan error, 1)
		go func() {
			done <- runComponents(ctx, zap.New(core), []component{
				{name: "a", run: func(ctx context.Context) error {
					for {
						select {
						case <-ctx.Done():
							return nil
						case reply := <-ping:
							reply <- ctx.Err()
						}
					}
				}},
				{name: "writer", finite: true, run: func(context.Context) error { return nil }},
			})
		}()
		// Wait until runComponents has dealt with the writer's return.
		writer := func() []observer.LoggedEntry {
			return logs.FilterField(zap.String(logkeys.Component, "writer")).All()
		}
		deadline := time.Now().Add(10 * time.Second)
		for len(writer()) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("runComponents logged nothing about the finished writer")
			}
			time.Sleep(time.Millisecond)
		}
		if msg := writer()[0].Message; msg != "component finished" {
			t.Fatalf("the writer's return was handled as %q, want \"component finished\"", msg)
		}
		// The other component still runs, with a live context, and
		// runComponents has not returned.
		reply := make(chan error)
		select {
		case ping <- reply:
			if err := <-reply; err != nil {
				t.Fatalf("the other component's context ended: %v", err)
			}
		case err := <-done:
			t.Fatalf("runComponents returned %v after a finite component finished", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("err %v after cancel", err)
		}
	})
	t.Run("context.Canceled while stopping is not a failure", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := runComponents(ctx, zap.NewNop(), []component{
			{name: "a", run: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
		})
		if err != nil {
			t.Errorf("err %v", err)
		}
	})
}

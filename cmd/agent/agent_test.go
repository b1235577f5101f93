package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
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
			return logs.FilterField(zap.String(keyComponent, "writer")).All()
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

// TestBinary builds meshagent and runs it as a process: bad configuration
// exits 2 with one line, and the dev agent answers /healthz/live and stops
// cleanly on SIGTERM and SIGINT.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "meshagent")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	t.Run("bad CA_PROVIDER exits 2", func(t *testing.T) {
		cmd := exec.Command(bin, "run")
		cmd.Dir = t.TempDir()
		cmd.Env = []string{"CA_PROVIDER=Bogus"}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("err %v, output %q", err, out)
		}
		if string(out) != "invalid CA_PROVIDER=\"Bogus\": accepted: Citadel, Linkerd\n" {
			t.Errorf("output %q", out)
		}
	})

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run("dev agent stops on "+sig.String(), func(t *testing.T) {
			cmd := exec.Command(bin, "run", "--dev")
			cmd.Dir = t.TempDir()
			cmd.Env = []string{"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1"}
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			addr := make(chan string, 1)
			var logs strings.Builder
			go func() {
				sc := bufio.NewScanner(stderr)
				for sc.Scan() {
					logs.WriteString(sc.Text() + "\n")
					var line struct{ Msg, Addr string }
					if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "status server listening" {
						addr <- line.Addr
					}
				}
				exited <- cmd.Wait()
			}()
			select {
			case a := <-addr:
				if code, body := httpGet(t, "http://"+a+"/healthz/live"); code != 200 {
					t.Errorf("live: %d %q", code, body)
				}
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("no status server")
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("exit: %v\n%s", err, logs.String())
				}
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("agent did not stop")
			}
		})
	}
}

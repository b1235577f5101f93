// Package test holds the end-to-end tests: the agent as cmd/agent runs it
// (its wiring, package internal/app, in the test's process on a fake clock,
// or the built binary), against real servers on loopback (test CAs, an xDS
// server) and Envoy-like clients on real Unix sockets.
package test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(inotifyHogEnv) == "1" {
		os.Exit(hogInotify())
	}
	if pid := os.Getenv(peekEnv); pid != "" {
		os.Exit(peek(pid))
	}
	if socket := os.Getenv(svidClientEnv); socket != "" {
		os.Exit(svidClient(socket))
	}
	goleak.VerifyTestMain(m)
}

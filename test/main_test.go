// Package test holds the end-to-end tests: the agent's components wired as
// cmd/agent wires them, against real servers on loopback (test CAs, an xDS
// server) and Envoy-like clients on real Unix sockets.
package test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Package heavy marks the tests of the full suite: those that start etcd and
// kube-apiserver, a built binary (the agent, helm, a copy of the test
// binary run as another user) or a kubelet. `go test -short ./...` skips
// them, so the inner loop runs only tests that need nothing but the Go
// toolchain; `make test` runs them all. The shared helpers that start such
// things (kubeenv.Shared.Env, agentproc.Start, ...) call Skip, so a test
// that uses them needs no check of its own.
package heavy

import (
	"flag"
	"testing"
)

// Skip skips t under -short, saying what it would have started.
func Skip(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: this test %s (make test runs it)", what)
	}
}

// Short reports whether the tests run with -short, for a TestMain that
// would start something before any test runs (it parses the flags, as
// m.Run would).
func Short() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	return testing.Short()
}

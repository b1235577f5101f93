package sds_test

import (
	"context"

	"github.com/meshagent/meshagent/sds"
	"github.com/meshagent/meshagent/secretmanager"
)

// Serving a secret manager's secrets on pilot-agent's socket path, as
// cmd/agent does; both run until ctx ends.
func Example() {
	run := func(ctx context.Context, m *secretmanager.Manager) error {
		srv, err := sds.New(sds.Config{
			SocketPath: "./var/run/secrets/workload-spiffe-uds/socket",
			Secrets:    m, // any Secret/Watch pair will do
		})
		if err != nil {
			return err
		}
		return srv.Run(ctx)
	}
	_ = run
}

package workloadapi_test

import (
	"context"

	"google.golang.org/grpc"

	"github.com/meshagent/meshagent/internal/uds/udsserver"
	"github.com/meshagent/meshagent/sds"
	"github.com/meshagent/meshagent/workloadapi"
)

// Serving SDS and the SPIFFE Workload API on one socket, as cmd/agent does.
// SPIFFE clients then find it with
// SPIFFE_ENDPOINT_SOCKET=unix://<absolute socket path>.
func Example() {
	run := func(ctx context.Context, secrets workloadapi.SecretSource, envoy sds.SecretSource) error {
		sdsServer, err := sds.New(sds.Config{Secrets: envoy})
		if err != nil {
			return err
		}
		wl, err := workloadapi.New(workloadapi.Config{Secrets: secrets})
		if err != nil {
			return err
		}
		socket, err := udsserver.New(udsserver.Config{
			SocketPath: "./var/run/secrets/workload-spiffe-uds/socket",
			Services:   []func(*grpc.Server){sdsServer.Register, wl.Register},
		})
		if err != nil {
			return err
		}
		return socket.Run(ctx)
	}
	_ = run
}

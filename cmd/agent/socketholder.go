package main

import (
	"errors"
	"io"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/internal/logging"
	"github.com/meshagent/meshagent/internal/uds/handoff"
)

// newSocketHolderCommand is `meshagent socket-holder`: the node chart's
// container that keeps the agent's socket answering while the agent's
// container restarts (internal/uds/handoff). It runs unprivileged, as the
// agent's uid, beside the agent.
func newSocketHolderCommand(stderr io.Writer) *cobra.Command {
	var socket, private, logLevel string
	cmd := &cobra.Command{
		Use:   "socket-holder",
		Short: "Keep the node agent's socket answering while the agent restarts; the agent takes it through --private (MESHAGENT_SOCKET_HANDOFF)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if socket == "" || private == "" {
				return configError(errors.New("--socket and --private are required"))
			}
			log, err := logging.New(logging.Config{Level: logLevel, Output: stderr})
			if err != nil {
				return configError(err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			h := &handoff.Holder{Path: socket, Private: private, Logger: log.Named("socket-holder")}
			if err := h.Run(ctx); err != nil {
				return runFailure(err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&socket, "socket", "/var/run/secrets/workload-spiffe-uds/socket", "the socket pods connect to (the agent's MESHAGENT_SDS_SOCKET as this container sees it)")
	f.StringVar(&private, "private", "", "the holder's own socket, in a directory only the agent shares (the agent's MESHAGENT_SOCKET_HANDOFF)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

package main

import (
	"errors"
	"io"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/internal/app"
	"github.com/meshagent/meshagent/internal/logging"
	"github.com/meshagent/meshagent/internal/settings"
)

// newTrustPublisherCommand is `meshagent trust-publisher`: the one component
// of a cluster that publishes the mesh's roots as the Pod Certificates
// signer's ClusterTrustBundle (the chart's trust-publisher Deployment, with
// attest on the signer and write access to that bundle alone). Node agents
// only sign (docs/pod-certificates.md).
func newTrustPublisherCommand(env []string, stderr io.Writer) *cobra.Command {
	var signer, roots, kubeconfig, logLevel string
	cmd := &cobra.Command{
		Use:   "trust-publisher --signer <name> --roots <file>",
		Short: "Publish the mesh roots as the Pod Certificates signer's ClusterTrustBundle (one per cluster)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The settings registry resolves them, as for run: each flag
			// stands for the agent's setting, which the environment may set.
			e := env
			if signer != "" {
				e = append([]string{"MESHAGENT_POD_CERTIFICATE_SIGNER=" + signer}, env...)
			}
			s, err := settings.Resolve(settings.Input{Env: e, Flags: map[string]string{
				"ca-root": roots, "kubeconfig": kubeconfig, "log-level": logLevel,
			}})
			if err != nil {
				return configError(err)
			}
			log, err := logging.New(logging.Config{Level: s.LogLevel, Output: stderr})
			if err != nil {
				return configError(err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			err = app.RunTrustPublisher(ctx, app.TrustPublisherConfig{Settings: s, Version: version, Logger: log})
			switch {
			case err == nil:
				return nil
			case errors.As(err, new(app.ConfigError)):
				return configError(err)
			default:
				return runFailure(err)
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&signer, "signer", "", "the signer name, e.g. meshagent.io/workload-identity (env MESHAGENT_POD_CERTIFICATE_SIGNER)")
	f.StringVar(&roots, "roots", "", "PEM file of the mesh's roots, followed as it changes (env CA_ROOT_CA; default: the agent's CA root)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server; empty: in-cluster (env KUBECONFIG)")
	f.StringVar(&logLevel, "log-level", "", "debug, info, warn or error (env MESHAGENT_LOG_LEVEL; default info)")
	return cmd
}

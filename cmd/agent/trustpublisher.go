package main

import (
	"errors"
	"io"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/internal/app"
	"github.com/meshagent/meshagent/internal/logging"
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
			log, err := logging.New(logging.Config{Level: logLevel, Output: stderr})
			if err != nil {
				return configError{err}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			err = app.RunTrustPublisher(ctx, app.TrustPublisherConfig{
				Signer: signer, Roots: roots, Kubeconfig: kubeconfig, Version: version, Logger: log,
			})
			switch {
			case err == nil:
				return nil
			case errors.As(err, new(app.ConfigError)):
				return configError{err}
			default:
				return runFailure{err}
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&signer, "signer", lookupEnv(env, "MESHAGENT_POD_CERTIFICATE_SIGNER"), "the signer name, e.g. meshagent.io/workload-identity (env MESHAGENT_POD_CERTIFICATE_SIGNER)")
	f.StringVar(&roots, "roots", "./var/run/secrets/istio/root-cert.pem", "PEM file of the mesh's roots, followed as it changes")
	f.StringVar(&kubeconfig, "kubeconfig", lookupEnv(env, "KUBECONFIG"), "kubeconfig of the API server; empty: in-cluster (env KUBECONFIG)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// lookupEnv returns the last value of name in env, or "".
func lookupEnv(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v = val
		}
	}
	return v
}

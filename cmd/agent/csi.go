package main

import (
	"errors"
	"io"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/internal/csi"
	"github.com/meshagent/meshagent/internal/logging"
)

// newCSICommand is `meshagent csi`: the node plugin of the CSI driver csi.meshagent.io,
// which mounts the node agent's socket directory read-only into pods (internal/csi).
// It runs as its own privileged container beside the unprivileged agent container.
func newCSICommand(stderr io.Writer) *cobra.Command {
	var nodeID, socketDir, kubeletDir, logLevel, tokenDir, tokenAudience string
	cmd := &cobra.Command{
		Use:   "csi",
		Short: "Run the CSI driver " + csi.DriverName + " that mounts the node agent's socket directory read-only into pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if nodeID == "" {
				return configError(errors.New("--node-id is required: the name of this node (the chart passes spec.nodeName)"))
			}
			log, err := logging.New(logging.Config{Level: logLevel, Output: stderr})
			if err != nil {
				return configError(err)
			}
			d, err := csi.NewDriver(csi.DriverConfig{
				NodeID:        nodeID,
				SocketDir:     socketDir,
				TargetRoot:    filepath.Join(kubeletDir, "pods"),
				TokenDir:      tokenDir,
				TokenAudience: tokenAudience,
				Version:       version,
				Logger:        log.Named("csi"),
			})
			if err != nil {
				return configError(err)
			}
			srv, err := csi.NewServer(csi.ServerConfig{
				Driver:             d,
				Endpoint:           filepath.Join(kubeletDir, "plugins", csi.DriverName, "csi.sock"),
				RegistrationSocket: filepath.Join(kubeletDir, "plugins_registry", csi.DriverName+"-reg.sock"),
				Logger:             log.Named("csi"),
			})
			if err != nil {
				return configError(err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			if err := srv.Run(ctx); err != nil {
				return runFailure(err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&nodeID, "node-id", "", "name of this node (the chart passes spec.nodeName)")
	f.StringVar(&socketDir, "socket-dir", "/var/run/secrets/workload-spiffe-uds", "the node agent's socket directory as this container sees it: what pods get")
	f.StringVar(&kubeletDir, "kubelet-dir", "/var/lib/kubelet", "the kubelet's root directory (--root-dir), mounted at the same path with Bidirectional propagation")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&tokenDir, "token-dir", "", "hand each pod's service-account token for --token-audience, which the kubelet passes the driver (CSIDriver tokenRequests), over to the node agent in this directory (its MESHAGENT_NODE_POD_TOKENS_DIR); empty: none")
	f.StringVar(&tokenAudience, "token-audience", "identity.l5d.io", "the audience of the token handed over with --token-dir")
	return cmd
}

package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/meshagent/meshagent/internal/logkeys"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Driver serves the CSI Identity and Node services. Required.
	Driver *Driver
	// Endpoint is the path of the CSI socket, the kubelet's view of it
	// (/var/lib/kubelet/plugins/csi.meshagent.io/csi.sock). Required.
	Endpoint string
	// RegistrationSocket is the path of the registration socket in the kubelet's
	// plugin-registration directory
	// (/var/lib/kubelet/plugins_registry/csi.meshagent.io-reg.sock). Required.
	RegistrationSocket string
	// Logger; nil logs nothing.
	Logger *zap.Logger
}

// Server serves the driver on its CSI socket and announces it to the kubelet on the
// registration socket.
type Server struct {
	cfg ServerConfig
	log *zap.Logger
}

// NewServer checks cfg and returns a Server; nothing is started.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Driver == nil {
		return nil, errors.New("csi: driver is required")
	}
	if !filepath.IsAbs(cfg.Endpoint) || !filepath.IsAbs(cfg.RegistrationSocket) {
		return nil, errors.New("csi: endpoint and registration socket must be absolute paths")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Server{cfg: cfg, log: cfg.Logger}, nil
}

// Run serves until ctx ends, then removes both sockets. The CSI socket listens before
// the registration socket appears, so the kubelet never dials a driver that is not there.
func (s *Server) Run(ctx context.Context) error {
	csiLis, err := listenUnix(s.cfg.Endpoint)
	if err != nil {
		return err
	}
	csiSrv := grpc.NewServer()
	csipb.RegisterIdentityServer(csiSrv, s.cfg.Driver)
	csipb.RegisterNodeServer(csiSrv, s.cfg.Driver)

	regLis, err := listenUnix(s.cfg.RegistrationSocket)
	if err != nil {
		csiLis.Close()
		return err
	}
	regSrv := grpc.NewServer()
	failed := make(chan error, 1)
	registerapi.RegisterRegistrationServer(regSrv, &registrar{endpoint: s.cfg.Endpoint, log: s.log, failed: failed})

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return serve(csiSrv, csiLis, "CSI") })
	g.Go(func() error { return serve(regSrv, regLis, "registration") })
	g.Go(func() error {
		var err error
		select {
		case <-ctx.Done():
		case err = <-failed:
		}
		// Graceful: the answer to the kubelet's refusal still reaches it.
		regSrv.GracefulStop()
		csiSrv.GracefulStop()
		return err
	})
	s.log.Info("csi driver serving", zap.String(logkeys.Endpoint, s.cfg.Endpoint), zap.String(logkeys.RegistrationSocket, s.cfg.RegistrationSocket))
	err = g.Wait()
	os.Remove(s.cfg.RegistrationSocket)
	os.Remove(s.cfg.Endpoint)
	return err
}

func serve(srv *grpc.Server, lis net.Listener, what string) error {
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving %s socket: %w", what, err)
	}
	return nil
}

// listenUnix listens on path, removing a socket a previous run left there. Only root
// (the kubelet) may connect: the socket is 0600.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("csi: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("csi: %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("csi: removing stale socket: %w", err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("csi: %w", err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("csi: %w", err)
	}
	return lis, nil
}

// registrar is the kubelet's plugin-registration service: the kubelet finds its socket
// in the plugins_registry directory, asks GetInfo, validates, dials Endpoint for
// NodeGetInfo and reports the outcome with NotifyRegistrationStatus.
type registrar struct {
	registerapi.UnimplementedRegistrationServer
	endpoint string
	log      *zap.Logger
	failed   chan<- error
}

// supportedVersions are the CSI versions the kubelet may speak to the driver.
var supportedVersions = []string{"1.0.0"}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              DriverName,
		Endpoint:          r.endpoint,
		SupportedVersions: supportedVersions,
	}, nil
}

// NotifyRegistrationStatus logs the kubelet's verdict. A refusal stops the server: a
// driver the kubelet does not use should fail visibly (its container restarts) rather
// than look healthy.
func (r *registrar) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		r.log.Info("registered with the kubelet")
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	err := fmt.Errorf("csi: the kubelet refused the driver: %s", st.GetError())
	r.log.Error("registration refused", zap.String(logkeys.Error, st.GetError()))
	select {
	case r.failed <- err:
	default:
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

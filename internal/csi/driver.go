package csi

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/node/podtokens"
)

// DriverName is the CSI driver's name: the CSIDriver object's name and what pods write
// in their csi volume's driver field.
const DriverName = "csi.meshagent.io"

// DriverConfig configures a Driver.
type DriverConfig struct {
	// NodeID is the name of the node (NodeGetInfo). Required.
	NodeID string
	// SocketDir is the directory holding the agent's socket, as this process sees it:
	// the source of every bind mount. Required.
	SocketDir string
	// TargetRoot is the directory every target path must be under: the kubelet's pods
	// directory (/var/lib/kubelet/pods). Required.
	TargetRoot string
	// TokenDir, when set, is the directory the driver hands each pod's
	// service-account token for TokenAudience over to the node agent in
	// (internal/node/podtokens): the kubelet passes the token in every
	// NodePublishVolume (the CSIDriver's tokenRequests and
	// requiresRepublish), the driver writes it under the pod's UID and
	// removes it at NodeUnpublishVolume. Empty: no tokens are handed over.
	TokenDir string
	// TokenAudience is the audience of the token handed over (Linkerd's
	// identity.l5d.io). Required with TokenDir.
	TokenAudience string
	// Version is reported by GetPluginInfo.
	Version string
	// Logger; nil logs nothing.
	Logger *zap.Logger
}

// Driver implements the CSI Identity and Node services of csi.meshagent.io for
// ephemeral inline volumes.
type Driver struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedNodeServer

	cfg DriverConfig
	log *zap.Logger

	// targets serialises calls on one target path: a path always takes the same lock,
	// and the set of locks is fixed, so nothing grows with the pods a node has seen.
	targets [64]sync.Mutex

	// unmount is umount2(2); a test replaces it to make the kernel disagree with
	// the mount table.
	unmount func(target string, flags int) error
}

// maxUnmounts bounds the unmounts of one unpublish: a target stacked by older drivers
// holds a few mounts, never this many.
const maxUnmounts = 32

// NewDriver checks cfg and returns a Driver.
func NewDriver(cfg DriverConfig) (*Driver, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("csi: node ID is required")
	}
	for name, p := range map[string]string{"socket directory": cfg.SocketDir, "target root": cfg.TargetRoot} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return nil, fmt.Errorf("csi: %s %q: want a clean absolute path", name, p)
		}
	}
	if cfg.TokenDir != "" && (!filepath.IsAbs(cfg.TokenDir) || cfg.TokenAudience == "") {
		return nil, fmt.Errorf("csi: token directory %q: want an absolute path and a token audience", cfg.TokenDir)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Driver{cfg: cfg, log: cfg.Logger, unmount: unix.Unmount}, nil
}

// GetPluginInfo names the driver.
func (d *Driver) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	v := d.cfg.Version
	if v == "" {
		v = "dev"
	}
	return &csipb.GetPluginInfoResponse{Name: DriverName, VendorVersion: v}, nil
}

// GetPluginCapabilities reports none: there is no Controller service.
func (d *Driver) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	return &csipb.GetPluginCapabilitiesResponse{}, nil
}

// Probe is ready once the socket directory exists.
func (d *Driver) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	if _, err := os.Stat(d.cfg.SocketDir); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "socket directory: %v", err)
	}
	return &csipb.ProbeResponse{}, nil
}

// NodeGetInfo names the node; the driver attaches nothing, so there is no volume limit.
func (d *Driver) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: d.cfg.NodeID}, nil
}

// NodeGetCapabilities reports none: no staging, no stats, no expansion.
func (d *Driver) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{}, nil
}

// NodePublishVolume bind-mounts the socket directory read-only at the target path,
// whatever the pod asked (read-only or not, any attributes). A target that is already a
// mount point is left as it is, made read-only if it is not: never a second mount.
func (d *Driver) NodePublishVolume(_ context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	target, err := d.checkPublish(req)
	if err != nil {
		return nil, err
	}
	log := d.log.With(zap.String(logkeys.VolumeID, req.GetVolumeId()), zap.String(logkeys.TargetPath, target))
	unlock := d.lock(target)
	defer unlock()
	// Every publish, the first and each republish, hands the pod's current
	// token over before anything else.
	if err := d.handOverToken(req, target, log); err != nil {
		return nil, err
	}

	if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, status.Errorf(codes.Internal, "creating target: %v", err)
	}
	mounts, err := mountsAt(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reading the mount table: %v", err)
	}
	if len(mounts) > 0 {
		if !readOnly(mounts[len(mounts)-1]) {
			if err := remountReadOnly(target); err != nil {
				return nil, status.Errorf(codes.Internal, "%v", err)
			}
		}
		log.Info("volume already published: nothing mounted")
		return &csipb.NodePublishVolumeResponse{}, nil
	}
	if err := unix.Mount(d.cfg.SocketDir, target, "", unix.MS_BIND, ""); err != nil {
		return nil, status.Errorf(codes.Internal, "bind-mounting %s: %v", d.cfg.SocketDir, err)
	}
	if err := remountReadOnly(target); err != nil {
		// Never leave a writable view of the socket directory behind.
		if uerr := unix.Unmount(target, unix.MNT_DETACH); uerr != nil {
			log.Error("undoing a writable bind mount failed", zap.Error(uerr))
		}
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	log.Info("volume published")
	return &csipb.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts every mount at the target path and removes the directory.
// A target that is not mounted, or gone, is already unpublished.
func (d *Driver) NodeUnpublishVolume(_ context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	target, err := d.checkTarget(req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	unlock := d.lock(target)
	defer unlock()
	// One at a time: a target stacked by an older driver is cleaned up too. When
	// umount(2) says EINVAL (not a mount point) while the mount table still lists
	// one, what is left is detached lazily (MNT_DETACH); if that is refused too, or
	// after maxUnmounts, the call fails and the kubelet asks again later.
	lazy := false
	for i := 0; ; i++ {
		mounts, err := mountsAt(target)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "reading the mount table: %v", err)
		}
		if len(mounts) == 0 {
			break
		}
		if i == maxUnmounts {
			return nil, status.Errorf(codes.Internal, "%d mounts still at the target after %d unmounts", len(mounts), maxUnmounts)
		}
		flags := 0
		if lazy {
			flags = unix.MNT_DETACH
		}
		err = d.unmount(target, flags)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINVAL) && !lazy:
			lazy = true
			d.log.Warn("the target is listed as mounted but umount says it is not: detaching lazily", zap.String(logkeys.TargetPath, target))
		default:
			return nil, status.Errorf(codes.Internal, "unmounting (flags %#x): %v", flags, err)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "removing target: %v", err)
	}
	if d.cfg.TokenDir != "" {
		if uid, ok := d.podUIDOf(target); ok {
			if err := podtokens.Remove(d.cfg.TokenDir, uid); err != nil {
				return nil, status.Errorf(codes.Internal, "removing the pod's token: %v", err)
			}
		}
	}
	d.log.Info("volume unpublished", zap.String(logkeys.VolumeID, req.GetVolumeId()), zap.String(logkeys.TargetPath, target))
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// checkPublish validates a publish request and returns its target path. Only what the
// driver needs is checked; volume attributes and the pod's read-only flag are ignored
// (the mount is read-only whatever they say).
func (d *Driver) checkPublish(req *csipb.NodePublishVolumeRequest) (string, error) {
	if req.GetVolumeId() == "" {
		return "", status.Error(codes.InvalidArgument, "volume_id is required")
	}
	capability := req.GetVolumeCapability()
	if capability == nil {
		return "", status.Error(codes.InvalidArgument, "volume_capability is required")
	}
	if capability.GetMount() == nil {
		return "", status.Error(codes.InvalidArgument, "only filesystem volumes are served (no block access)")
	}
	if req.GetStagingTargetPath() != "" {
		return "", status.Error(codes.InvalidArgument, "the driver has no staging step")
	}
	return d.checkTarget(req.GetTargetPath())
}

// checkTarget accepts a clean absolute path strictly under the target root.
func (d *Driver) checkTarget(p string) (string, error) {
	if p == "" {
		return "", status.Error(codes.InvalidArgument, "target_path is required")
	}
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsRune(p, 0) {
		return "", status.Errorf(codes.InvalidArgument, "target_path %q: want a clean absolute path", p)
	}
	rel, err := filepath.Rel(d.cfg.TargetRoot, p)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", status.Errorf(codes.InvalidArgument, "target_path %q is not under %s", p, d.cfg.TargetRoot)
	}
	return p, nil
}

// handOverToken writes the token for the configured audience that the
// kubelet passed in req's volume context into the token directory, under
// the UID of the pod the target path belongs to. A volume context naming
// another pod is refused; one without the token is published all the same
// (the socket is what every pod gets), and logged.
func (d *Driver) handOverToken(req *csipb.NodePublishVolumeRequest, target string, log *zap.Logger) error {
	if d.cfg.TokenDir == "" {
		return nil
	}
	uid, ok := d.podUIDOf(target)
	if !ok {
		return status.Errorf(codes.InvalidArgument, "target_path %q is not under a pod's directory (%s/<pod UID>/...)", target, d.cfg.TargetRoot)
	}
	if named := req.GetVolumeContext()[podtokens.PodUIDKey]; named != "" && named != uid {
		return status.Errorf(codes.InvalidArgument, "volume context names pod %s, the target path pod %s", named, uid)
	}
	tok, ok, err := podtokens.FromVolumeContext(req.GetVolumeContext(), d.cfg.TokenAudience)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "%v", err)
	}
	if !ok {
		log.Warn("no service-account token for the audience in the volume context: is the CSIDriver's tokenRequests set?", zap.String(logkeys.Audience, d.cfg.TokenAudience))
		return nil
	}
	if err := podtokens.Write(d.cfg.TokenDir, uid, tok); err != nil {
		return status.Errorf(codes.Internal, "handing the pod's token over: %v", err)
	}
	log.Debug("pod token handed over", zap.String(logkeys.PodUID, uid), zap.Time(logkeys.NotAfter, tok.ExpirationTimestamp))
	return nil
}

// podUIDOf returns the pod UID a target path belongs to: the kubelet's
// <pods dir>/<pod UID>/volumes/kubernetes.io~csi/<volume>/mount.
func (d *Driver) podUIDOf(target string) (string, bool) {
	rel, err := filepath.Rel(d.cfg.TargetRoot, target)
	if err != nil {
		return "", false
	}
	uid, _, _ := strings.Cut(rel, "/")
	return uid, podtokens.ValidPodUID(uid)
}

func (d *Driver) lock(target string) (unlock func()) {
	h := fnv.New32a()
	h.Write([]byte(target))
	m := &d.targets[h.Sum32()%uint32(len(d.targets))]
	m.Lock()
	return m.Unlock
}

// remountReadOnly makes the bind mount at target read-only, without set-user-ID,
// devices or execution.
func remountReadOnly(target string) error {
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("remounting %s read-only: %w", target, err)
	}
	return nil
}

// mountsAt lists the mounts at target in the agent's mount namespace,
// bottom first.
func mountsAt(target string) ([]*mountinfo.Info, error) {
	return mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) { return m.Mountpoint != target, false })
}

// readOnly reports whether m is mounted read-only.
func readOnly(m *mountinfo.Info) bool { return slices.Contains(strings.Split(m.Options, ","), "ro") }

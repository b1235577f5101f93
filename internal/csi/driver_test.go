package csi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// node is a socket directory and a kubelet pods directory in a temporary directory.
type node struct {
	socketDir, pods string
}

func newNode(t *testing.T) node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := t.TempDir()
	n := node{socketDir: filepath.Join(dir, "socket"), pods: filepath.Join(dir, "pods")}
	for _, d := range []string{n.socketDir, n.pods} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(n.socketDir, "socket"), []byte("agent"), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n node) driver(t *testing.T) *Driver {
	t.Helper()
	d, err := NewDriver(DriverConfig{NodeID: "node-1", SocketDir: n.socketDir, TargetRoot: n.pods})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// target makes the kubelet's parent directory of a pod volume and returns the target
// path inside it (the kubelet creates the parent, the driver the target).
func (n node) target(t *testing.T, pod string) string {
	t.Helper()
	parent := filepath.Join(n.pods, pod, "volumes", "kubernetes.io~csi", "meshagent")
	if err := os.MkdirAll(parent, 0o750); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(parent, "mount")
	t.Cleanup(func() {
		for range 10 {
			if unix.Unmount(target, unix.MNT_DETACH) != nil {
				return
			}
		}
	})
	return target
}

func publishReq(target string) *csipb.NodePublishVolumeRequest {
	return &csipb.NodePublishVolumeRequest{
		VolumeId:   "csi-0123",
		TargetPath: target,
		VolumeCapability: &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
		// What a pod asks is ignored: the mount is read-only anyway.
		Readonly:      false,
		VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "true", "anything": "else"},
	}
}

func mustMounts(t *testing.T, target string) []*mountinfo.Info {
	t.Helper()
	m, err := mountsAt(target)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestPublishBindsTheSocketDirectoryReadOnly(t *testing.T) {
	n := newNode(t)
	d := n.driver(t)
	target := n.target(t, "pod-a")
	if _, err := d.NodePublishVolume(context.Background(), publishReq(target)); err != nil {
		t.Fatal(err)
	}
	mounts := mustMounts(t, target)
	if len(mounts) != 1 {
		t.Fatalf("%d mounts at the target, want 1", len(mounts))
	}
	if !readOnly(mounts[0]) {
		t.Fatalf("mount options %v: not read-only", mounts[0].Options)
	}
	got, err := os.ReadFile(filepath.Join(target, "socket"))
	if err != nil || string(got) != "agent" {
		t.Fatalf("the socket directory is not visible at the target: %q, %v", got, err)
	}
	// Root in the pod cannot replace or remove the socket.
	if err := os.Remove(filepath.Join(target, "socket")); !errors.Is(err, unix.EROFS) {
		t.Fatalf("removing the socket through the volume: %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(target, "other"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("creating a file through the volume: %v, want EROFS", err)
	}
	// The agent re-creating its socket is seen through the existing mount.
	if err := os.WriteFile(filepath.Join(n.socketDir, "socket"), []byte("agent again"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(target, "socket")); string(got) != "agent again" {
		t.Fatalf("after the agent rewrote its socket the target shows %q", got)
	}
}

// The kubelet calls NodePublishVolume again for every volume after it restarts, and a
// restarted driver knows nothing: neither may add a mount.
func TestPublishAgainAddsNoMount(t *testing.T) {
	n := newNode(t)
	target := n.target(t, "pod-a")
	for i, d := range []*Driver{n.driver(t), n.driver(t), n.driver(t)} {
		for range 2 {
			if _, err := d.NodePublishVolume(context.Background(), publishReq(target)); err != nil {
				t.Fatalf("driver %d: %v", i, err)
			}
		}
	}
	if m := mustMounts(t, target); len(m) != 1 {
		t.Fatalf("%d mounts at the target after six publishes, want 1", len(m))
	}
}

// A target mounted writable (by hand, or by another driver) is made read-only, not
// mounted over.
func TestPublishMakesAnExistingWritableMountReadOnly(t *testing.T) {
	n := newNode(t)
	target := n.target(t, "pod-a")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(n.socketDir, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := n.driver(t).NodePublishVolume(context.Background(), publishReq(target)); err != nil {
		t.Fatal(err)
	}
	m := mustMounts(t, target)
	if len(m) != 1 || !readOnly(m[0]) {
		t.Fatalf("mounts at the target: %+v; want one read-only", m)
	}
}

func TestUnpublishIsIdempotent(t *testing.T) {
	n := newNode(t)
	d := n.driver(t)
	target := n.target(t, "pod-a")
	if _, err := d.NodePublishVolume(context.Background(), publishReq(target)); err != nil {
		t.Fatal(err)
	}
	// A target stacked by an older driver is cleaned up whole.
	if err := unix.Mount(n.socketDir, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	req := &csipb.NodeUnpublishVolumeRequest{VolumeId: "csi-0123", TargetPath: target}
	for i := range 2 {
		if _, err := d.NodeUnpublishVolume(context.Background(), req); err != nil {
			t.Fatalf("unpublish %d: %v", i, err)
		}
		if m := mustMounts(t, target); len(m) != 0 {
			t.Fatalf("unpublish %d: %d mounts left", i, len(m))
		}
		if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("unpublish %d: target still there: %v", i, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(n.socketDir, "socket")); err != nil || string(got) != "agent" {
		t.Fatalf("the socket directory was touched: %q, %v", got, err)
	}
}

func TestRequestChecks(t *testing.T) {
	root := "/var/lib/kubelet/pods"
	d, err := NewDriver(DriverConfig{NodeID: "n", SocketDir: "/run/meshagent", TargetRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	good := root + "/uid/volumes/kubernetes.io~csi/v/mount"
	tests := []struct {
		name   string
		mutate func(*csipb.NodePublishVolumeRequest)
		ok     bool
	}{
		{"valid", func(*csipb.NodePublishVolumeRequest) {}, true},
		{"pod asks read-only", func(r *csipb.NodePublishVolumeRequest) { r.Readonly = true }, true},
		{"no attributes", func(r *csipb.NodePublishVolumeRequest) { r.VolumeContext = nil }, true},
		{"no volume id", func(r *csipb.NodePublishVolumeRequest) { r.VolumeId = "" }, false},
		{"no capability", func(r *csipb.NodePublishVolumeRequest) { r.VolumeCapability = nil }, false},
		{"block", func(r *csipb.NodePublishVolumeRequest) {
			r.VolumeCapability.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
		}, false},
		{"staging path", func(r *csipb.NodePublishVolumeRequest) { r.StagingTargetPath = "/x" }, false},
		{"no target", func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = "" }, false},
		{"relative target", func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = "pods/x" }, false},
		{"target escapes with ..", func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = root + "/../../../etc" }, false},
		{"unclean target", func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = root + "//x/" }, false},
		{"target is the root", func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = root }, false},
		{"target beside the root", func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = root + "-other/x" }, false},
		{"target elsewhere", func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = "/etc/kubernetes" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := publishReq(good)
			tt.mutate(req)
			_, err := d.checkPublish(req)
			if tt.ok != (err == nil) {
				t.Fatalf("checkPublish: %v, want ok=%v", err, tt.ok)
			}
			if err != nil && status.Code(err) != codes.InvalidArgument {
				t.Fatalf("code %v, want InvalidArgument", status.Code(err))
			}
		})
	}
}

func FuzzCheckTarget(f *testing.F) {
	root := "/var/lib/kubelet/pods"
	d, err := NewDriver(DriverConfig{NodeID: "n", SocketDir: "/run/meshagent", TargetRoot: root})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{root + "/a/mount", root, "/", "", "../x", root + "/../x", root + "x/y", "/var/lib/kubelet/pods/\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := d.checkTarget(p)
		if err != nil {
			return
		}
		// Whatever is accepted is a clean absolute path strictly inside the root.
		if got != p || filepath.Clean(p) != p || !filepath.IsAbs(p) {
			t.Fatalf("accepted %q as %q", p, got)
		}
		if len(p) <= len(root)+1 || p[:len(root)+1] != root+"/" {
			t.Fatalf("accepted %q outside %s", p, root)
		}
	})
}

// When umount(2) says EINVAL for a target the mount table lists, the unpublish
// neither spins nor gives up: what is left is detached lazily. When the lazy
// unmount is refused too, the call fails (the kubelet asks again) after a bounded
// number of unmounts.
func TestUnpublishIsBounded(t *testing.T) {
	n := newNode(t)
	req := func(target string) *csipb.NodeUnpublishVolumeRequest {
		return &csipb.NodeUnpublishVolumeRequest{VolumeId: "csi-0123", TargetPath: target}
	}
	unpublish := func(t *testing.T, d *Driver, target string) error {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			_, err := d.NodeUnpublishVolume(context.Background(), req(target))
			done <- err
		}()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("unpublish did not return within 10 s: the unmount loop is unbounded")
			return nil
		}
	}

	t.Run("lazy fallback", func(t *testing.T) {
		d := n.driver(t)
		target := n.target(t, "pod-a")
		if _, err := d.NodePublishVolume(context.Background(), publishReq(target)); err != nil {
			t.Fatal(err)
		}
		var calls []int
		d.unmount = func(target string, flags int) error {
			calls = append(calls, flags)
			if flags&unix.MNT_DETACH == 0 {
				return unix.EINVAL
			}
			return unix.Unmount(target, flags)
		}
		if err := unpublish(t, d, target); err != nil {
			t.Fatal(err)
		}
		if len(calls) != 2 || calls[1] != unix.MNT_DETACH {
			t.Errorf("unmount flags %v, want a plain unmount then MNT_DETACH", calls)
		}
		if m := mustMounts(t, target); len(m) != 0 {
			t.Fatalf("%d mounts left", len(m))
		}
	})
	t.Run("refused for good", func(t *testing.T) {
		d := n.driver(t)
		target := n.target(t, "pod-b")
		if _, err := d.NodePublishVolume(context.Background(), publishReq(target)); err != nil {
			t.Fatal(err)
		}
		calls := 0
		d.unmount = func(string, int) error { calls++; return unix.EINVAL }
		err := unpublish(t, d, target)
		if status.Code(err) != codes.Internal {
			t.Fatalf("unpublish: %v, want Internal", err)
		}
		if calls > maxUnmounts {
			t.Errorf("%d unmounts, want at most %d", calls, maxUnmounts)
		}
	})
}

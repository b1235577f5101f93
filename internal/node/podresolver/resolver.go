package podresolver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/node/podcgroup"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

// Refusal reasons: the values of the "reason" label of
// meshagent_node_callers_refused_total and of Refusal.Reason.
const (
	ReasonNoPID          = "no_pid"
	ReasonProcessGone    = "process_gone"
	ReasonPIDReused      = "pid_reused"
	ReasonProcUnreadable = "proc_unreadable"
	ReasonCgroup         = "cgroup_invalid"
	ReasonNodeProcess    = "node_process"
	ReasonContainer      = "container_runtime"
	ReasonStaticPod      = "static_pod"
	ReasonPodUnknown     = "pod_unknown"
	ReasonPodTerminated  = "pod_terminated"
	ReasonCanceled       = "canceled"
)

// Kinds of resolved callers: the values of the "kind" label of
// meshagent_node_callers_resolved_total.
const (
	kindPod  = "pod"
	kindNode = "node_uid"
)

// Refusal is the error Resolve returns for a caller it does not serve. Its
// text is meant for the caller: it speaks of the caller's own process and
// pod only.
type Refusal struct {
	// Reason is one of the Reason constants.
	Reason string
	msg    string
	// pod is the pod UID the process's cgroup names, for a pod not known
	// yet (see PodUID).
	pod string
}

func (r *Refusal) Error() string { return r.msg }

// PodUID is the UID of the pod the process's cgroup names, when the pod
// itself is not known yet (Temporary); "" otherwise. The socket server
// counts the connection against that pod meanwhile (caller.PodOf).
func (r *Refusal) PodUID() string { return r.pod }

// Temporary reports whether the refusal may change for the same process:
// its pod was not known yet (the informer may see it later), or the lookup
// gave up. Any other refusal is final for the connection.
func (r *Refusal) Temporary() bool { return r.Reason == ReasonPodUnknown || r.Reason == ReasonCanceled }

// errPodNotYetKnown: the pod is not in the index and the caller may not wait.
var errPodNotYetKnown = errors.New("pod not known yet")

func refuse(reason, format string, args ...any) *Refusal {
	return &Refusal{Reason: reason, msg: "caller refused: " + fmt.Sprintf(format, args...)}
}

// Pods finds a pod of the node by UID: Get at once, Wait until it appears
// or ctx ends. *podindex.Index implements it.
type Pods interface {
	Get(uid string) (podindex.Pod, bool)
	Wait(ctx context.Context, uid string) (podindex.Pod, error)
}

// Config configures a Resolver.
type Config struct {
	// Pods are the node's pods. Required.
	Pods Pods
	// CgroupRoot is where the kubelet makes pod cgroups: a process counts
	// as in a pod only under it (CgroupRoot finds it); the zero value is
	// podcgroup.DefaultRoot.
	CgroupRoot podcgroup.Root
	// NodeUIDs are the identities of processes outside any pod, by uid. A
	// node process whose uid is not here is refused.
	NodeUIDs map[uint32]pki.Identity
	// PodWait bounds the wait for a pod the informer has not seen yet (a
	// container can start before the watch event arrives); 0 means 2s.
	PodWait time.Duration
	// ProcRoot is where procfs is mounted; "" means /proc. Any other root
	// (tests) turns pidfds off: its pids are not this kernel's.
	ProcRoot string
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
	// Registerer receives the resolver's metrics; nil means none.
	Registerer prometheus.Registerer
}

// Resolver maps a local socket's peer to its pod and identity. It
// implements caller.Resolver.
type Resolver struct {
	cfg     Config
	log     *zap.Logger
	metrics *metrics
	pidfds  bool

	// afterCgroupRead, when set (tests), runs between reading the cgroup
	// file and checking that the process is still the same.
	afterCgroupRead func()
}

var (
	_ caller.Resolver = (*Resolver)(nil)
	_ caller.Grouper  = (*Resolver)(nil)
)

// New returns a Resolver. It starts nothing.
func New(cfg Config) (*Resolver, error) {
	if cfg.Pods == nil {
		return nil, errors.New("podresolver: Pods is required")
	}
	if cfg.PodWait <= 0 {
		cfg.PodWait = 2 * time.Second
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Resolver{
		cfg:     cfg,
		log:     cfg.Logger.Named("podresolver"),
		metrics: m,
		pidfds:  filepath.Clean(cfg.ProcRoot) == "/proc",
	}, nil
}

// Resolve finds the pod of the process behind cred and returns its
// identity, or a *Refusal.
func (r *Resolver) Resolve(ctx context.Context, cred caller.Cred) (caller.Info, error) {
	info, kind, err := r.resolve(ctx, cred)
	if err != nil {
		var ref *Refusal
		if !errors.As(err, &ref) {
			ref = refuse(ReasonProcUnreadable, "%v", err)
			err = ref
		}
		r.metrics.refused.WithLabelValues(ref.Reason).Inc()
		// The socket server logs the refusals it makes of these, at a
		// bounded rate: a flood of connections writes no line each here.
		r.log.Debug("caller refused", zap.Stringer(logkeys.Cred, cred), zap.String(logkeys.Reason, ref.Reason), zap.Error(err))
		return caller.Info{}, err
	}
	r.metrics.resolved.WithLabelValues(kind).Inc()
	r.log.Debug("caller resolved", zap.Stringer(logkeys.Cred, cred), zap.Stringer(logkeys.Identity, info.Identity), zap.String(logkeys.Pod, info.Pod))
	return info, nil
}

func (r *Resolver) resolve(ctx context.Context, cred caller.Cred) (caller.Info, string, error) {
	if cred.PID <= 0 {
		return caller.Info{}, "", refuse(ReasonNoPID, "the kernel gave no pid for the connecting process (is the agent in the host's PID namespace?)")
	}
	data, err := r.readCgroup(ctx, cred.PID)
	if err != nil {
		return caller.Info{}, "", err
	}
	where, err := r.cfg.CgroupRoot.Parse(data)
	if errors.Is(err, podcgroup.ErrNotInPod) {
		id, ok := r.cfg.NodeUIDs[cred.UID]
		if !ok {
			return caller.Info{}, "", refuse(ReasonNodeProcess, "process %d is not in a pod and uid %d has no node identity", cred.PID, cred.UID)
		}
		// A node identity is for the node's own processes: a uid and a cgroup
		// that is no container runtime's. A docker or podman container on the
		// node runs as the same uids and is not the node.
		if scope, in := podcgroup.ContainerRuntime(data); in {
			return caller.Info{}, "", refuse(ReasonContainer, "process %d runs in a container outside the kubelet's pods (cgroup %s): uid %d's node identity is for node processes only", cred.PID, scope, cred.UID)
		}
		return caller.Info{Cred: cred, Identity: id}, kindNode, nil
	}
	if err != nil {
		return caller.Info{}, "", refuse(ReasonCgroup, "process %d: %v", cred.PID, err)
	}
	if where.Static() {
		return caller.Info{}, "", refuse(ReasonStaticPod, "process %d is in static pod %s (a kubelet manifest; its cgroup names the manifest's hash, not a pod of the API server): static pods are not served", cred.PID, where.UID)
	}
	pod, err := r.pod(ctx, where.UID)
	if err != nil {
		var ref *Refusal
		switch {
		case ctx.Err() != nil:
			ref = refuse(ReasonCanceled, "gave up waiting for pod %s of process %d: %v", where.UID, cred.PID, ctx.Err())
		case !caller.MayWait(ctx):
			ref = refuse(ReasonPodUnknown, "pod %s of process %d is not known on this node yet", where.UID, cred.PID)
		default:
			ref = refuse(ReasonPodUnknown, "pod %s of process %d is not known on this node after %s", where.UID, cred.PID, r.cfg.PodWait)
		}
		ref.pod = where.UID
		return caller.Info{}, "", ref
	}
	if pod.Terminated() {
		return caller.Info{}, "", refuse(ReasonPodTerminated, "pod %s of process %d has terminated (%s)", where.UID, cred.PID, pod.Phase)
	}
	return caller.Info{Cred: cred, Identity: pod.Identity, Pod: pod.String(), PodUID: pod.UID}, kindPod, nil
}

// pod returns the pod with uid, waiting up to PodWait for the informer to
// see it (not at all under caller.NoWait). A known pod (the usual case) is answered without a timer: a
// context derived from the stream's would leave a child map on the
// stream's context and a stopped timer in the runtime's timer heap, both
// kept for the connection's life.
func (r *Resolver) pod(ctx context.Context, uid string) (podindex.Pod, error) {
	if p, ok := r.cfg.Pods.Get(uid); ok {
		return p, nil
	}
	if !caller.MayWait(ctx) {
		return podindex.Pod{}, errPodNotYetKnown
	}
	wctx, cancel := context.WithTimeout(ctx, r.cfg.PodWait)
	defer cancel()
	return r.cfg.Pods.Wait(wctx, uid)
}

// maxCgroupFile bounds what is read of /proc/<pid>/cgroup.
const maxCgroupFile = 64 << 10

// procBuffer holds a cgroup v2 file (one line) and a stat file after it
// without growing; cgroup v1's dozen lines grow it once.
const procBuffer = 1 << 10

// readCgroup reads /proc/<pid>/cgroup so that the content is known to be
// that of the process the pid named when the lookup started (see doc.go).
func (r *Resolver) readCgroup(ctx context.Context, pid int32) ([]byte, error) {
	pin, err := r.pin(ctx, pid)
	if err != nil {
		return nil, err
	}
	defer pin.release()
	dir := filepath.Join(r.cfg.ProcRoot, strconv.Itoa(int(pid)))
	buf := make([]byte, 0, procBuffer)
	if pin.fd >= 0 {
		// The process is pinned: alive after the read, it held its pid
		// throughout, and what was read was its own.
		data, err := appendFile(buf, filepath.Join(dir, "cgroup"), maxCgroupFile)
		if err != nil {
			return nil, procError(pid, err)
		}
		if r.afterCgroupRead != nil {
			r.afterCgroupRead()
		}
		if err := pin.alive(pid); err != nil {
			return nil, err
		}
		return data, nil
	}
	// Without a pidfd the start time before and after tells a reused pid.
	// One buffer for the three files: the first stat file at its start
	// (parsed, then overwritten), the cgroup file there, and the second
	// stat file after the cgroup file.
	before, err := startTime(dir, pid, buf)
	if err != nil {
		return nil, procError(pid, err)
	}
	data, err := appendFile(buf, filepath.Join(dir, "cgroup"), maxCgroupFile)
	if err != nil {
		return nil, procError(pid, err)
	}
	if r.afterCgroupRead != nil {
		r.afterCgroupRead()
	}
	after, err := startTime(dir, pid, data)
	if err != nil {
		return nil, procError(pid, err)
	}
	if after != before {
		return nil, refuse(ReasonPIDReused, "process %d exited and its pid was reused during the lookup", pid)
	}
	return data, nil
}

// Group names the pod the process behind cred is in now, from its cgroup
// file alone (caller.Grouper): one small read, and no identity (the
// process is not pinned; Resolve decides who it is). ok is false when
// the file cannot be read (the process has exited) or names no pod of a
// known shape.
func (r *Resolver) Group(cred caller.Cred) (podUID string, ok bool) {
	if cred.PID <= 0 {
		return "", false
	}
	var buf [procBuffer]byte
	data, err := appendFile(buf[:0], filepath.Join(r.cfg.ProcRoot, strconv.Itoa(int(cred.PID)), "cgroup"), maxCgroupFile)
	if err != nil {
		return "", false
	}
	where, err := r.cfg.CgroupRoot.Parse(data)
	switch {
	case errors.Is(err, podcgroup.ErrNotInPod):
		return "", true
	case err != nil:
		return "", false
	}
	return where.UID, true
}

func procError(pid int32, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return refuse(ReasonProcessGone, "process %d has exited", pid)
	}
	return refuse(ReasonProcUnreadable, "reading process %d: %v", pid, err)
}

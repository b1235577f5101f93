package caller

import (
	"context"
	"errors"
	"strconv"

	"github.com/meshagent/meshagent/internal/pki"
)

// Cred is what the kernel reports of the process that connected to a Unix
// socket (SO_PEERCRED), read when it connected.
type Cred struct {
	UID, GID uint32
	PID      int32
}

// String formats the credentials as uid=.. gid=.. pid=...
func (c Cred) String() string {
	return "uid=" + strconv.FormatUint(uint64(c.UID), 10) + " gid=" + strconv.FormatUint(uint64(c.GID), 10) +
		" pid=" + strconv.FormatInt(int64(c.PID), 10)
}

// Info is the caller of an RPC as the agent resolved it.
type Info struct {
	// Cred are the kernel's credentials of the connection.
	Cred Cred
	// Identity is the workload identity the caller is entitled to (a SPIFFE
	// ID, or Linkerd's DNS identity). Zero means the agent's own identity
	// (a sidecar or VM agent serves one workload).
	Identity pki.Identity
	// Pod is "<namespace>/<name>" of the caller's pod and PodUID its UID, in
	// node mode; empty otherwise.
	Pod, PodUID string
}

// Resolver decides who the process behind a connection is.
type Resolver interface {
	// Resolve maps the kernel's credentials of a connection to the caller.
	// An error refuses the caller; its text names the reason and is shown to
	// the caller with PermissionDenied, so it must not reveal other callers.
	// A refusal is final for the connection unless the error is Temporary
	// (see IsTemporary).
	Resolve(ctx context.Context, cred Cred) (Info, error)
}

// IsTemporary reports whether a Resolver's refusal may change for the same
// connection (a pod not known yet when its first process connects): err,
// or an error it wraps, has a Temporary method that reports true.
func IsTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// PodOf returns the pod UID a refusal names, when the Resolver knows which
// pod the process is in but not yet the pod (its cgroup names the pod, the
// pod index has not seen it): err, or an error it wraps, has a PodUID
// method that returns it. The socket server counts such a connection
// against that pod, not against its uid.
func PodOf(err error) string {
	var p interface{ PodUID() string }
	if errors.As(err, &p) {
		return p.PodUID()
	}
	return ""
}

// Grouper is implemented by a Resolver that can tell, cheaply and before
// resolving, which pod the process behind a connection is in now (in node
// mode, the pod its cgroup names). The socket server shares what
// identifying and refusing connections may hold among pods by it: one pod
// cannot take it all, whatever uids its processes take. It is no identity:
// the process may exit and its pid be reused meanwhile; Resolve decides
// who the caller is.
type Grouper interface {
	// Group returns the UID of the pod the process behind cred is in, ""
	// for a process in no pod; ok is false when it cannot be told (the
	// process has exited, its cgroup is not a pod's of a known shape).
	Group(cred Cred) (podUID string, ok bool)
}

type ctxKey struct{}

type noWaitKey struct{}

// NoWait returns ctx telling a Resolver not to wait for what it does not
// know yet (a pod its informer has not seen): it refuses for now at once
// instead. The socket server resolves each new connection so, and lets
// the connection's first RPC wait.
func NoWait(ctx context.Context) context.Context {
	return context.WithValue(ctx, noWaitKey{}, true)
}

// MayWait reports whether a Resolver may wait under ctx (see NoWait).
func MayWait(ctx context.Context) bool {
	no, _ := ctx.Value(noWaitKey{}).(bool)
	return !no
}

// NewContext returns ctx carrying info.
func NewContext(ctx context.Context, info Info) context.Context {
	return context.WithValue(ctx, ctxKey{}, info)
}

// FromContext returns the caller carried by ctx, if any.
func FromContext(ctx context.Context) (Info, bool) {
	info, ok := ctx.Value(ctxKey{}).(Info)
	return info, ok
}

// Key names the workload the caller was resolved to, for per-caller limits:
// "pod:<uid>" or "identity:<id>" in node mode; empty when nothing was
// resolved (a sidecar or VM agent, whose every caller is its one workload).
func (i Info) Key() string {
	switch {
	case i.PodUID != "":
		return "pod:" + i.PodUID
	case !i.Identity.IsZero():
		return "identity:" + i.Identity.String()
	}
	return ""
}

package brokerapi

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/brokerapi/brokerpb"
	"github.com/meshagent/meshagent/internal/node/peerpidfd"
	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/internal/node/podresolver"
	"github.com/meshagent/meshagent/internal/uds/caller"
)

// The reference types served: their full protobuf names, as Any's type URL
// ends.
const (
	refTypePID        = "spiffe.broker.WorkloadPIDReference"
	refTypeKubernetes = "spiffe.broker.KubernetesObjectReference"
)

// A KubernetesObjectReference is served for pods only.
const (
	podsPlural = "pods"
	coreGroup  = "core"
)

// workload is a resolved reference: the pod, and how the broker named it
// (for messages).
type workload struct {
	pod podindex.Pod
	via string
	// pin is the referenced process, for a pid reference; nil otherwise.
	// The stream closes it.
	pin *processPin
}

// resolve turns a reference into a pod of this node that may have an SVID,
// or a refusal. refType is the reference's type name, for the refusal.
func (s *Server) resolve(ctx context.Context, b Broker, ref *brokerpb.WorkloadReference) (w workload, refType string, r *refusal) {
	if ref.GetReference() == nil {
		return workload{}, "", invalidRef("the request has no workload reference")
	}
	ra := ref.GetReference()
	refType = string(ra.MessageName())
	switch refType {
	case refTypePID:
		if !b.PID {
			return workload{}, refType, typeNotAllowed(b, "WorkloadPIDReference")
		}
		var pidRef brokerpb.WorkloadPIDReference
		if err := anypb.UnmarshalTo(ra, &pidRef, unmarshalOpts); err != nil {
			return workload{}, refType, invalidRef("malformed WorkloadPIDReference: " + err.Error())
		}
		w, r = s.byPID(ctx, pidRef.GetPid())
	case refTypeKubernetes:
		var k brokerpb.KubernetesObjectReference
		if err := anypb.UnmarshalTo(ra, &k, unmarshalOpts); err != nil {
			return workload{}, refType, invalidRef("malformed KubernetesObjectReference: " + err.Error())
		}
		if k.GetType().GetPlural() != podsPlural || k.GetType().GetGroup() != coreGroup {
			return workload{}, refType, invalidRef(fmt.Sprintf("KubernetesObjectReference of type {plural: %q, group: %q} is not served: only pods (plural pods, group core) are",
				k.GetType().GetPlural(), k.GetType().GetGroup()))
		}
		if !b.Pod {
			return workload{}, refType, typeNotAllowed(b, "KubernetesObjectReference to pods")
		}
		w, r = s.byPodRef(ctx, &k)
	default:
		return workload{}, refType, invalidRef(fmt.Sprintf("reference type %q is not served: use spiffe.broker.WorkloadPIDReference or spiffe.broker.KubernetesObjectReference", refType))
	}
	if r != nil {
		return workload{}, refType, r
	}
	if w.pod.Terminated() || w.pod.Identity.SPIFFEID == "" {
		w.pin.closeIfSet()
	}
	if w.pod.Terminated() {
		return workload{}, refType, notEntitled(fmt.Sprintf("%s: pod %s has finished (%s)", w.via, w.pod.String(), w.pod.Phase))
	}
	if w.pod.Identity.SPIFFEID == "" {
		return workload{}, refType, notEntitled(fmt.Sprintf("%s: the identity of pod %s, %s, is not a SPIFFE ID", w.via, w.pod.String(), w.pod.Identity.String()))
	}
	return w, refType, nil
}

// unmarshalOpts read a reference: unknown fields are kept (a newer broker
// may send more).
var unmarshalOpts = proto.UnmarshalOptions{}

func typeNotAllowed(b Broker, what string) *refusal {
	return &refusal{reason: refusedRefType, code: codes.PermissionDenied, msg: fmt.Sprintf("broker %s may not use %s", b.ID, what)}
}

// byPID finds the pod of a process of this node, as the node socket's
// callers are found: the process pinned by a pidfd while its cgroup is
// read, its start time checked, the cgroup under the kubelet's root.
func (s *Server) byPID(ctx context.Context, pid int32) (workload, *refusal) {
	via := "pid " + strconv.Itoa(int(pid))
	if pid <= 0 {
		return workload{}, invalidRef(fmt.Sprintf("WorkloadPIDReference: pid %d is not a positive integer", pid))
	}
	pin, err := pinProcess(pid)
	if errors.Is(err, errNoProcess) {
		return workload{}, notFound(fmt.Sprintf("%s: process %d has exited", via, pid))
	}
	if err != nil {
		return workload{}, notEntitled(fmt.Sprintf("%s: %v", via, err))
	}
	w, r := s.resolvePinned(ctx, pid, via, pin)
	if r != nil {
		pin.close()
		return workload{}, r
	}
	return w, nil
}

// resolvePinned resolves pid with the resolver checking that it is the
// process pin holds.
func (s *Server) resolvePinned(ctx context.Context, pid int32, via string, pin *processPin) (workload, *refusal) {
	info, err := s.cfg.Processes.Resolve(peerpidfd.NewContext(ctx, pin.fd), caller.Cred{PID: pid})
	if err != nil {
		var ref *podresolver.Refusal
		if errors.As(err, &ref) {
			switch ref.Reason {
			case podresolver.ReasonProcessGone, podresolver.ReasonPIDReused, podresolver.ReasonPodUnknown, podresolver.ReasonNoPID, podresolver.ReasonCanceled:
				return workload{}, notFound(via + ": " + ref.Error())
			}
		}
		return workload{}, notEntitled(via + ": " + err.Error())
	}
	if info.PodUID == "" {
		return workload{}, notEntitled(via + ": the process is not in a pod of this node")
	}
	p, ok := s.cfg.Pods.Get(info.PodUID)
	if !ok {
		return workload{}, notFound(fmt.Sprintf("%s: pod %s has left the node", via, info.PodUID))
	}
	return workload{pod: p, via: via, pin: pin}, nil
}

// byPodRef finds a pod of this node by key and/or UID; with both, the pod the
// key names must have that UID.
func (s *Server) byPodRef(ctx context.Context, k *brokerpb.KubernetesObjectReference) (workload, *refusal) {
	key, uid := k.GetKey(), k.GetUid()
	if key == nil && uid == "" {
		return workload{}, invalidRef("KubernetesObjectReference: neither key nor uid is set")
	}
	if key != nil {
		if key.GetName() == "" || key.GetNamespace() == "" {
			return workload{}, invalidRef("KubernetesObjectReference: a pod's key needs its namespace and name")
		}
		via := "pod " + key.GetNamespace() + "/" + key.GetName()
		p, ok := s.cfg.Pods.ByName(key.GetNamespace(), key.GetName())
		if !ok {
			return workload{}, notFound(via + ": no such pod on this node")
		}
		if uid != "" && p.UID != uid {
			return workload{}, notFound(fmt.Sprintf("%s: the pod of that name on this node has another UID than %s", via, uid))
		}
		return workload{pod: p, via: via}, nil
	}
	via := "pod uid " + uid
	p, ok := s.cfg.Pods.Get(uid)
	if !ok {
		// A pod just scheduled may reach the pod index a moment after
		// the broker learns of it.
		wctx, cancel := context.WithTimeout(ctx, s.cfg.PodWait)
		defer cancel()
		var err error
		if p, err = s.cfg.Pods.Wait(wctx, uid); err != nil {
			return workload{}, notFound(via + ": no such pod on this node")
		}
	}
	return workload{pod: p, via: via}, nil
}

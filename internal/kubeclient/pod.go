package kubeclient

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Pod is the part of a core/v1 Pod the agent reads. It is decoded from the
// API server's JSON, which skips every other field, so neither the full
// type nor its generated code is linked into the agent.
type Pod struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PodSpec   `json:"spec,omitempty"`
	Status            PodStatus `json:"status,omitempty"`
}

// PodSpec is the part of a pod's spec the agent reads.
type PodSpec struct {
	// ServiceAccountName is the pod's service account; the API server's
	// admission sets "default" when the pod names none.
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
	// NodeName is the node the pod is scheduled on; empty until it is.
	NodeName string `json:"nodeName,omitempty"`
	// Volumes are the pod's volumes; of each, only its name and a CSI
	// volume's driver are read.
	Volumes []Volume `json:"volumes,omitempty"`
}

// Volume is the part of a pod's volume the agent reads.
type Volume struct {
	Name string           `json:"name"`
	CSI  *CSIVolumeSource `json:"csi,omitempty"`
}

// CSIVolumeSource is the part of an inline CSI volume the agent reads.
type CSIVolumeSource struct {
	// Driver is the CSI driver that publishes the volume.
	Driver string `json:"driver"`
}

// PodStatus is the part of a pod's status the agent reads.
type PodStatus struct {
	Phase PodPhase `json:"phase,omitempty"`
}

// PodPhase is a pod's phase, as core/v1 spells it.
type PodPhase string

// The phases of a pod.
const (
	PodPending   PodPhase = "Pending"
	PodRunning   PodPhase = "Running"
	PodSucceeded PodPhase = "Succeeded"
	PodFailed    PodPhase = "Failed"
	PodUnknown   PodPhase = "Unknown"
)

// PodList is a page of pods.
type PodList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Pod `json:"items"`
}

// DeepCopyInto copies p into out.
func (p *Pod) DeepCopyInto(out *Pod) {
	*out = *p
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if p.Spec.Volumes != nil {
		out.Spec.Volumes = make([]Volume, len(p.Spec.Volumes))
		for i, v := range p.Spec.Volumes {
			out.Spec.Volumes[i] = v
			if v.CSI != nil {
				csi := *v.CSI
				out.Spec.Volumes[i].CSI = &csi
			}
		}
	}
}

// DeepCopy returns a copy of p.
func (p *Pod) DeepCopy() *Pod {
	if p == nil {
		return nil
	}
	out := new(Pod)
	p.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (p *Pod) DeepCopyObject() runtime.Object { return p.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (l *PodList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &PodList{TypeMeta: l.TypeMeta, Items: deepCopyItems(l.Items)}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	return out
}

// deepCopyItems deep-copies the items of a list; nil stays nil.
func deepCopyItems[T any, P interface {
	*T
	DeepCopyInto(*T)
}](items []T) []T {
	if items == nil {
		return nil
	}
	out := make([]T, len(items))
	for i := range items {
		P(&items[i]).DeepCopyInto(&out[i])
	}
	return out
}

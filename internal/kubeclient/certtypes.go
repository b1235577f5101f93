package kubeclient

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// certificatesV1 is the group and version of PodCertificateRequests and
// ClusterTrustBundles.
var certificatesV1 = schema.GroupVersion{Group: "certificates.k8s.io", Version: "v1"}

// The agent's own copies of certificates.k8s.io/v1's PodCertificateRequest
// and ClusterTrustBundle, decoded from and encoded to the API server's JSON
// under the API's field names. k8s.io/api/certificates/v1 links core/v1's
// generated code, about 4.7 MB of binary for types the agent never uses.

// PodCertificateRequest is a kubelet's request for a pod's certificate.
type PodCertificateRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PodCertificateRequestSpec   `json:"spec"`
	Status            PodCertificateRequestStatus `json:"status,omitempty"`
}

// PodCertificateRequestSpec is the request; every field is immutable.
type PodCertificateRequestSpec struct {
	SignerName           string    `json:"signerName"`
	PodName              string    `json:"podName"`
	PodUID               types.UID `json:"podUID"`
	ServiceAccountName   string    `json:"serviceAccountName"`
	ServiceAccountUID    types.UID `json:"serviceAccountUID"`
	NodeName             string    `json:"nodeName"`
	NodeUID              types.UID `json:"nodeUID"`
	MaxExpirationSeconds *int32    `json:"maxExpirationSeconds,omitempty"`
	// StubPKCS10Request is a DER CSR signed by the pod's key, otherwise
	// empty when the kubelet made it.
	StubPKCS10Request []byte `json:"stubPKCS10Request,omitempty"`
	// UnverifiedUserAnnotations are the pod author's, unchecked.
	UnverifiedUserAnnotations map[string]string `json:"unverifiedUserAnnotations,omitempty"`
}

// PodCertificateRequestStatus is the signer's answer.
type PodCertificateRequestStatus struct {
	Conditions       []metav1.Condition `json:"conditions,omitempty"`
	CertificateChain string             `json:"certificateChain,omitempty"`
	NotBefore        *metav1.Time       `json:"notBefore,omitempty"`
	BeginRefreshAt   *metav1.Time       `json:"beginRefreshAt,omitempty"`
	NotAfter         *metav1.Time       `json:"notAfter,omitempty"`
}

// Condition types and the API's reasons of PodCertificateRequests.
const (
	PodCertificateRequestIssued = "Issued"
	PodCertificateRequestDenied = "Denied"
	PodCertificateRequestFailed = "Failed"
	// ReasonUnsupportedKeyType denies a key type the signer does not issue for.
	ReasonUnsupportedKeyType = "UnsupportedKeyType"
	// ReasonInvalidUserAnnotations denies unverifiedUserAnnotations the
	// signer does not recognize.
	ReasonInvalidUserAnnotations = "InvalidUnverifiedUserAnnotations"
)

// PodCertificateRequestList is a page of requests.
type PodCertificateRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodCertificateRequest `json:"items"`
}

// ClusterTrustBundle is a cluster-scoped set of trust anchors.
type ClusterTrustBundle struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ClusterTrustBundleSpec `json:"spec"`
}

// ClusterTrustBundleSpec names the signer and holds the PEM roots.
type ClusterTrustBundleSpec struct {
	SignerName  string `json:"signerName,omitempty"`
	TrustBundle string `json:"trustBundle"`
}

// ClusterTrustBundleList is a page of bundles.
type ClusterTrustBundleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterTrustBundle `json:"items"`
}

// DeepCopyInto copies r into out.
func (r *PodCertificateRequest) DeepCopyInto(out *PodCertificateRequest) {
	*out = *r
	r.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	s, o := &r.Spec, &out.Spec
	if s.MaxExpirationSeconds != nil {
		v := *s.MaxExpirationSeconds
		o.MaxExpirationSeconds = &v
	}
	o.StubPKCS10Request = append([]byte(nil), s.StubPKCS10Request...)
	if s.UnverifiedUserAnnotations != nil {
		o.UnverifiedUserAnnotations = make(map[string]string, len(s.UnverifiedUserAnnotations))
		for k, v := range s.UnverifiedUserAnnotations {
			o.UnverifiedUserAnnotations[k] = v
		}
	}
	if r.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(r.Status.Conditions))
		for i := range r.Status.Conditions {
			r.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
	out.Status.NotBefore = r.Status.NotBefore.DeepCopy()
	out.Status.BeginRefreshAt = r.Status.BeginRefreshAt.DeepCopy()
	out.Status.NotAfter = r.Status.NotAfter.DeepCopy()
}

// DeepCopy returns a copy of r.
func (r *PodCertificateRequest) DeepCopy() *PodCertificateRequest {
	if r == nil {
		return nil
	}
	out := new(PodCertificateRequest)
	r.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (r *PodCertificateRequest) DeepCopyObject() runtime.Object { return r.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (l *PodCertificateRequestList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &PodCertificateRequestList{TypeMeta: l.TypeMeta, Items: deepCopyItems(l.Items)}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	return out
}

// DeepCopyInto copies b into out.
func (b *ClusterTrustBundle) DeepCopyInto(out *ClusterTrustBundle) {
	*out = *b
	b.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
}

// DeepCopy returns a copy of b.
func (b *ClusterTrustBundle) DeepCopy() *ClusterTrustBundle {
	if b == nil {
		return nil
	}
	out := new(ClusterTrustBundle)
	b.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (b *ClusterTrustBundle) DeepCopyObject() runtime.Object { return b.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (l *ClusterTrustBundleList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &ClusterTrustBundleList{TypeMeta: l.TypeMeta, Items: deepCopyItems(l.Items)}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	return out
}

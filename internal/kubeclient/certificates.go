package kubeclient

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Certificates makes the agent's requests to the certificates.k8s.io/v1
// API: a Pod Certificates signer's list, watch and status updates of
// PodCertificateRequests and the ClusterTrustBundle that publishes its
// roots, and the list and watch of a signer's ClusterTrustBundles that the
// trust bundle follows. It links certificates/v1's types only, none of the other
// API groups. It is safe for concurrent use.
type Certificates struct {
	rc     *rest.RESTClient
	params runtime.ParameterCodec
}

// NewCertificates returns a certificates.k8s.io/v1 client for rc. It does
// not contact the API server.
func NewCertificates(rc *rest.Config) (*Certificates, error) {
	scheme := runtime.NewScheme()
	scheme.AddKnownTypes(certificatesV1,
		&PodCertificateRequest{}, &PodCertificateRequestList{},
		&ClusterTrustBundle{}, &ClusterTrustBundleList{})
	metav1.AddToGroupVersion(scheme, certificatesV1)
	client, err := restClient(rc, certificatesV1, "/apis", scheme)
	if err != nil {
		return nil, fmt.Errorf("building the Kubernetes certificates client: %w", err)
	}
	return &Certificates{rc: client, params: runtime.NewParameterCodec(scheme)}, nil
}

// ListPodCertificateRequests lists the requests of every namespace that
// match opts.
func (c *Certificates) ListPodCertificateRequests(ctx context.Context, opts metav1.ListOptions) (*PodCertificateRequestList, error) {
	return list(ctx, c.resource("podcertificaterequests"), metav1.NamespaceAll, opts, &PodCertificateRequestList{})
}

// WatchPodCertificateRequests watches the requests of every namespace that
// match opts.
func (c *Certificates) WatchPodCertificateRequests(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return watchObjects(ctx, c.resource("podcertificaterequests"), metav1.NamespaceAll, opts)
}

// PodCertificateRequestListWatch lists and watches the requests of every
// namespace that match fieldSelector (e.g. "spec.nodeName=node-a"), for an
// informer of *PodCertificateRequest.
func (c *Certificates) PodCertificateRequestListWatch(fieldSelector string) cache.ListerWatcher {
	return listWatch(c.resource("podcertificaterequests"), metav1.NamespaceAll, fieldSelector,
		func() *PodCertificateRequestList { return &PodCertificateRequestList{} })
}

// ClusterTrustBundleListWatch lists and watches the ClusterTrustBundles
// that match fieldSelector (e.g. "spec.signerName=example.com/signer"), for
// an informer of *ClusterTrustBundle.
func (c *Certificates) ClusterTrustBundleListWatch(fieldSelector string) cache.ListerWatcher {
	return listWatch(c.resource("clustertrustbundles"), "", fieldSelector,
		func() *ClusterTrustBundleList { return &ClusterTrustBundleList{} })
}

func (c *Certificates) resource(name string) resource {
	return resource{rc: c.rc, params: c.params, name: name}
}

// UpdatePodCertificateRequestStatus writes req's status through the status
// subresource (PUT .../podcertificaterequests/<name>/status). The request's
// resource version must be the stored one.
func (c *Certificates) UpdatePodCertificateRequestStatus(ctx context.Context, req *PodCertificateRequest) (*PodCertificateRequest, error) {
	r := c.rc.Put().Namespace(req.Namespace).Resource("podcertificaterequests").Name(req.Name).SubResource("status").Body(req)
	return do(ctx, r, &PodCertificateRequest{})
}

// GetClusterTrustBundle reads the bundle called name.
func (c *Certificates) GetClusterTrustBundle(ctx context.Context, name string) (*ClusterTrustBundle, error) {
	return do(ctx, c.rc.Get().Resource("clustertrustbundles").Name(name), &ClusterTrustBundle{})
}

// CreateClusterTrustBundle creates b.
func (c *Certificates) CreateClusterTrustBundle(ctx context.Context, b *ClusterTrustBundle) (*ClusterTrustBundle, error) {
	return do(ctx, c.rc.Post().Resource("clustertrustbundles").Body(b), &ClusterTrustBundle{})
}

// UpdateClusterTrustBundle replaces the stored bundle with b, whose resource
// version must be the stored one.
func (c *Certificates) UpdateClusterTrustBundle(ctx context.Context, b *ClusterTrustBundle) (*ClusterTrustBundle, error) {
	return do(ctx, c.rc.Put().Resource("clustertrustbundles").Name(b.Name).Body(b), &ClusterTrustBundle{})
}

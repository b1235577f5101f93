package kubeclient

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Certificates makes the requests of a Pod Certificates signer to the
// certificates.k8s.io/v1 API: list, watch and status updates of
// PodCertificateRequests, and the ClusterTrustBundle that publishes the
// signer's roots. It links certificates/v1's types only, none of the other
// API groups. It is safe for concurrent use.
type Certificates struct {
	rc     *rest.RESTClient
	params runtime.ParameterCodec
}

// NewCertificates returns a certificates.k8s.io/v1 client for rc. It does
// not contact the API server.
func NewCertificates(rc *rest.Config) (*Certificates, error) {
	scheme := runtime.NewScheme()
	gv := certificatesV1
	scheme.AddKnownTypes(gv,
		&PodCertificateRequest{}, &PodCertificateRequestList{},
		&ClusterTrustBundle{}, &ClusterTrustBundleList{})
	metav1.AddToGroupVersion(scheme, gv)
	c := rest.CopyConfig(rc)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	client, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("building the Kubernetes certificates client: %w", err)
	}
	return &Certificates{rc: client, params: runtime.NewParameterCodec(scheme)}, nil
}

// ListPodCertificateRequests lists the requests of every namespace that
// match opts.
func (c *Certificates) ListPodCertificateRequests(ctx context.Context, opts metav1.ListOptions) (*PodCertificateRequestList, error) {
	out := &PodCertificateRequestList{}
	err := c.rc.Get().
		Resource("podcertificaterequests").
		VersionedParams(&opts, c.params).
		Timeout(timeout(opts)).
		Do(ctx).
		Into(out)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// WatchPodCertificateRequests watches the requests of every namespace that
// match opts.
func (c *Certificates) WatchPodCertificateRequests(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rc.Get().
		Resource("podcertificaterequests").
		VersionedParams(&opts, c.params).
		Timeout(timeout(opts)).
		Watch(ctx)
}

// PodCertificateRequestListWatch lists and watches the requests of every
// namespace that match fieldSelector (e.g. "spec.nodeName=node-a"), for an
// informer of *PodCertificateRequest.
func (c *Certificates) PodCertificateRequestListWatch(fieldSelector string) cache.ListerWatcher {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = fieldSelector
			return c.ListPodCertificateRequests(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = fieldSelector
			return c.WatchPodCertificateRequests(ctx, opts)
		},
	}
}

// UpdatePodCertificateRequestStatus writes req's status through the status
// subresource (PUT .../podcertificaterequests/<name>/status). The request's
// resource version must be the stored one.
func (c *Certificates) UpdatePodCertificateRequestStatus(ctx context.Context, req *PodCertificateRequest) (*PodCertificateRequest, error) {
	out := &PodCertificateRequest{}
	err := c.rc.Put().
		Namespace(req.Namespace).
		Resource("podcertificaterequests").
		Name(req.Name).
		SubResource("status").
		Body(req).
		Do(ctx).
		Into(out)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// GetClusterTrustBundle reads the bundle called name.
func (c *Certificates) GetClusterTrustBundle(ctx context.Context, name string) (*ClusterTrustBundle, error) {
	out := &ClusterTrustBundle{}
	if err := c.rc.Get().Resource("clustertrustbundles").Name(name).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// CreateClusterTrustBundle creates b.
func (c *Certificates) CreateClusterTrustBundle(ctx context.Context, b *ClusterTrustBundle) (*ClusterTrustBundle, error) {
	out := &ClusterTrustBundle{}
	if err := c.rc.Post().Resource("clustertrustbundles").Body(b).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// UpdateClusterTrustBundle replaces the stored bundle with b, whose resource
// version must be the stored one.
func (c *Certificates) UpdateClusterTrustBundle(ctx context.Context, b *ClusterTrustBundle) (*ClusterTrustBundle, error) {
	out := &ClusterTrustBundle{}
	if err := c.rc.Put().Resource("clustertrustbundles").Name(b.Name).Body(b).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

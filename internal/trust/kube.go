package trust

import (
	"context"
	"fmt"
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// The API groups and versions read here.
var (
	coreV1         = schema.GroupVersion{Version: "v1"}
	certificatesV1 = schema.GroupVersion{Group: "certificates.k8s.io", Version: "v1"}
)

// ConfigMap is the part of a core/v1 ConfigMap the agent reads, decoded from
// the API server's JSON (so core/v1's generated code is not linked).
type ConfigMap struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Data              map[string]string `json:"data,omitempty"`
	BinaryData        map[string][]byte `json:"binaryData,omitempty"`
}

// ConfigMapList is a page of ConfigMaps.
type ConfigMapList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ConfigMap `json:"items"`
}

// ClusterTrustBundle is the part of a certificates.k8s.io/v1
// ClusterTrustBundle the agent reads.
type ClusterTrustBundle struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ClusterTrustBundleSpec `json:"spec"`
}

// ClusterTrustBundleSpec holds a bundle's signer and its PEM roots.
type ClusterTrustBundleSpec struct {
	SignerName  string `json:"signerName,omitempty"`
	TrustBundle string `json:"trustBundle"`
}

// ClusterTrustBundleList is a page of ClusterTrustBundles.
type ClusterTrustBundleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterTrustBundle `json:"items"`
}

// DeepCopyObject implements runtime.Object.
func (c *ConfigMap) DeepCopyObject() runtime.Object {
	if c == nil {
		return nil
	}
	out := &ConfigMap{TypeMeta: c.TypeMeta, Data: maps.Clone(c.Data)}
	c.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if c.BinaryData != nil {
		out.BinaryData = make(map[string][]byte, len(c.BinaryData))
		for k, v := range c.BinaryData {
			out.BinaryData[k] = append([]byte(nil), v...)
		}
	}
	return out
}

// DeepCopyObject implements runtime.Object.
func (l *ConfigMapList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &ConfigMapList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	for i := range l.Items {
		out.Items = append(out.Items, *l.Items[i].DeepCopyObject().(*ConfigMap))
	}
	return out
}

// DeepCopyObject implements runtime.Object.
func (b *ClusterTrustBundle) DeepCopyObject() runtime.Object {
	if b == nil {
		return nil
	}
	out := &ClusterTrustBundle{TypeMeta: b.TypeMeta, Spec: b.Spec}
	b.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return out
}

// DeepCopyObject implements runtime.Object.
func (l *ClusterTrustBundleList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &ClusterTrustBundleList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	for i := range l.Items {
		out.Items = append(out.Items, *l.Items[i].DeepCopyObject().(*ClusterTrustBundle))
	}
	return out
}

// Kube lists and watches the objects trust bundles come from. It links only
// the small types above; see internal/kubeclient for why. Safe for
// concurrent use.
type Kube struct {
	core, certs *rest.RESTClient
	params      runtime.ParameterCodec
}

// NewKube returns a client for rc (internal/kubeclient.RESTConfig). It does
// not contact the API server.
func NewKube(rc *rest.Config) (*Kube, error) {
	s := runtime.NewScheme()
	s.AddKnownTypes(coreV1, &ConfigMap{}, &ConfigMapList{})
	metav1.AddToGroupVersion(s, coreV1)
	s.AddKnownTypes(certificatesV1, &ClusterTrustBundle{}, &ClusterTrustBundleList{})
	metav1.AddToGroupVersion(s, certificatesV1)
	codecs := serializer.NewCodecFactory(s).WithoutConversion()
	client := func(gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
		c := rest.CopyConfig(rc)
		c.GroupVersion = &gv
		c.APIPath = apiPath
		c.NegotiatedSerializer = codecs
		c.ContentType = runtime.ContentTypeJSON
		c.AcceptContentTypes = runtime.ContentTypeJSON
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		return rest.RESTClientFor(c)
	}
	core, err := client(coreV1, "/api")
	if err != nil {
		return nil, fmt.Errorf("building the Kubernetes client: %w", err)
	}
	certs, err := client(certificatesV1, "/apis")
	if err != nil {
		return nil, fmt.Errorf("building the Kubernetes client: %w", err)
	}
	return &Kube{core: core, certs: certs, params: runtime.NewParameterCodec(s)}, nil
}

// ConfigMapListWatch lists and watches the ConfigMaps of namespace that
// match fieldSelector, for an informer of *ConfigMap.
func (k *Kube) ConfigMapListWatch(namespace, fieldSelector string) cache.ListerWatcher {
	return k.listWatch(k.core, namespace, "configmaps", fieldSelector, func() runtime.Object { return &ConfigMapList{} })
}

// ClusterTrustBundleListWatch lists and watches the ClusterTrustBundles that
// match fieldSelector (e.g. spec.signerName=<name>), for an informer of
// *ClusterTrustBundle.
func (k *Kube) ClusterTrustBundleListWatch(fieldSelector string) cache.ListerWatcher {
	return k.listWatch(k.certs, "", "clustertrustbundles", fieldSelector, func() runtime.Object { return &ClusterTrustBundleList{} })
}

func (k *Kube) listWatch(c *rest.RESTClient, namespace, resource, fieldSelector string, newList func() runtime.Object) cache.ListerWatcher {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = fieldSelector
			out := newList()
			err := c.Get().
				NamespaceIfScoped(namespace, namespace != "").
				Resource(resource).
				VersionedParams(&opts, k.params).
				Do(ctx).
				Into(out)
			if err != nil {
				return nil, err
			}
			return out, nil
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = fieldSelector
			opts.Watch = true
			return c.Get().
				NamespaceIfScoped(namespace, namespace != "").
				Resource(resource).
				VersionedParams(&opts, k.params).
				Watch(ctx)
		},
	}
}

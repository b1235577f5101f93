package kubeclient

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// restClient returns a client of one API group and version (served under
// apiPath: "/api" for core/v1, "/apis" for the others) that knows the
// types of scheme.
func restClient(rc *rest.Config, gv schema.GroupVersion, apiPath string, scheme *runtime.Scheme) (*rest.RESTClient, error) {
	c := rest.CopyConfig(rc)
	c.GroupVersion = &gv
	c.APIPath = apiPath
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	return rest.RESTClientFor(c)
}

// resource is one kind of object (its plural name, e.g. "pods") read
// through the client of its API group.
type resource struct {
	rc     *rest.RESTClient
	params runtime.ParameterCodec
	name   string
}

// do sends r and decodes the answer into out.
func do[T runtime.Object](ctx context.Context, r *rest.Request, out T) (T, error) {
	if err := r.Do(ctx).Into(out); err != nil {
		var none T
		return none, err
	}
	return out, nil
}

// list decodes into out the objects of namespace that match opts; an empty
// namespace is every namespace, or a cluster-scoped resource.
func list[L runtime.Object](ctx context.Context, r resource, namespace string, opts metav1.ListOptions, out L) (L, error) {
	req := r.rc.Get().
		NamespaceIfScoped(namespace, namespace != "").
		Resource(r.name).
		VersionedParams(&opts, r.params).
		Timeout(timeout(opts))
	return do(ctx, req, out)
}

// watchObjects watches the objects of namespace that match opts, as list.
func watchObjects(ctx context.Context, r resource, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.rc.Get().
		NamespaceIfScoped(namespace, namespace != "").
		Resource(r.name).
		VersionedParams(&opts, r.params).
		Timeout(timeout(opts)).
		Watch(ctx)
}

// listWatch lists (into newList) and watches the objects of namespace that
// match fieldSelector, for a client-go informer.
func listWatch[L runtime.Object](r resource, namespace, fieldSelector string, newList func() L) cache.ListerWatcher {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = fieldSelector
			out, err := list(ctx, r, namespace, opts, newList())
			if err != nil {
				return nil, err // not out: a nil *List would be a non-nil runtime.Object
			}
			return out, nil
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = fieldSelector
			return watchObjects(ctx, r, namespace, opts)
		},
	}
}

func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

package kubeclient

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Config says where the client configuration comes from.
type Config struct {
	// Kubeconfig is a list of kubeconfig files separated by the OS path list
	// separator, as in KUBECONFIG. Empty means the in-cluster configuration.
	Kubeconfig string
	// UserAgent is sent with every request. Empty: client-go's default.
	UserAgent string
}

// RESTConfig loads the configuration. It reads files but does not contact
// the API server.
func RESTConfig(cfg Config) (*rest.Config, error) {
	var (
		rc  *rest.Config
		err error
	)
	if cfg.Kubeconfig != "" {
		rules := &clientcmd.ClientConfigLoadingRules{Precedence: filepath.SplitList(cfg.Kubeconfig)}
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %s: %w", cfg.Kubeconfig, err)
		}
	} else {
		rc, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, errors.New("no Kubernetes API configuration: KUBECONFIG is not set and the agent does not run in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set)")
		}
		if err != nil {
			return nil, fmt.Errorf("loading the in-cluster Kubernetes configuration: %w", err)
		}
	}
	if cfg.UserAgent != "" {
		rc.UserAgent = cfg.UserAgent
	}
	return rc, nil
}

// coreV1 is the group and version of pods and service accounts.
var coreV1 = schema.GroupVersion{Version: "v1"}

// Client makes the agent's core/v1 requests to the API server: TokenRequest
// for a service account, and list and watch of pods and ConfigMaps. It is safe for concurrent use.
type Client struct {
	core   *rest.RESTClient
	params runtime.ParameterCodec
}

// New loads the configuration (RESTConfig) and returns a client for it.
func New(cfg Config) (*Client, error) {
	rc, err := RESTConfig(cfg)
	if err != nil {
		return nil, err
	}
	return NewForConfig(rc)
}

// NewForConfig returns a client for rc. It does not contact the API server.
func NewForConfig(rc *rest.Config) (*Client, error) {
	scheme := newScheme()
	core, err := restClient(rc, coreV1, "/api", scheme)
	if err != nil {
		return nil, fmt.Errorf("building the Kubernetes client: %w", err)
	}
	return &Client{core: core, params: runtime.NewParameterCodec(scheme)}, nil
}

// newScheme knows the few types the client sends and receives, and the
// meta types of lists, watches and errors. Pods and ConfigMaps are the
// agent's own small types (Pod, ConfigMap) under core/v1's names, so they
// are always asked for as JSON.
func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	s.AddKnownTypes(coreV1, &Pod{}, &PodList{}, &ConfigMap{}, &ConfigMapList{})
	metav1.AddToGroupVersion(s, coreV1)
	s.AddKnownTypes(authenticationv1.SchemeGroupVersion, &authenticationv1.TokenRequest{})
	metav1.AddToGroupVersion(s, authenticationv1.SchemeGroupVersion)
	return s
}

// CreateToken asks for a token of the service account namespace/serviceAccount
// (POST /api/v1/namespaces/<namespace>/serviceaccounts/<name>/token) and
// returns the API server's answer. An error from the API server is an
// *errors.StatusError of k8s.io/apimachinery/pkg/api/errors.
func (c *Client) CreateToken(ctx context.Context, namespace, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	r := c.core.Post().
		UseProtobufAsDefault().
		Namespace(namespace).
		Resource("serviceaccounts").
		Name(serviceAccount).
		SubResource("token").
		Body(req)
	return do(ctx, r, &authenticationv1.TokenRequest{})
}

// ListPods lists the pods of namespace (metav1.NamespaceAll: every
// namespace) that match opts.
func (c *Client) ListPods(ctx context.Context, namespace string, opts metav1.ListOptions) (*PodList, error) {
	return list(ctx, c.resource("pods"), namespace, opts, &PodList{})
}

// WatchPods watches the pods of namespace (metav1.NamespaceAll: every
// namespace) that match opts.
func (c *Client) WatchPods(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	return watchObjects(ctx, c.resource("pods"), namespace, opts)
}

// PodListWatch lists and watches the pods of every namespace that match
// fieldSelector (e.g. "spec.nodeName=node-a"; empty: all), for an informer
// (cache.NewSharedIndexInformer with &Pod{}).
func (c *Client) PodListWatch(fieldSelector string) cache.ListerWatcher {
	return listWatch(c.resource("pods"), metav1.NamespaceAll, fieldSelector, func() *PodList { return &PodList{} })
}

// ConfigMapListWatch lists and watches the ConfigMaps of namespace that
// match fieldSelector (e.g. "metadata.name=istio-ca-root-cert"), for an
// informer of *ConfigMap.
func (c *Client) ConfigMapListWatch(namespace, fieldSelector string) cache.ListerWatcher {
	return listWatch(c.resource("configmaps"), namespace, fieldSelector, func() *ConfigMapList { return &ConfigMapList{} })
}

func (c *Client) resource(name string) resource {
	return resource{rc: c.core, params: c.params, name: name}
}

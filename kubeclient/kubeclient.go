package kubeclient

import (
	"errors"
	"fmt"
	"path/filepath"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
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

// New returns a clientset for the configuration.
func New(cfg Config) (kubernetes.Interface, error) {
	rc, err := RESTConfig(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("building the Kubernetes client: %w", err)
	}
	return cs, nil
}

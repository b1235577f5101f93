//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/test/istiod"
)

// istiodIP is the ClusterIP of the Service istio-system/istiod. istiod runs as a
// host process inside the cluster's network namespace listening on that address
// (put on the namespace's loopback, as the kubernetes Service's is): pods reach it
// through the Service's address without kube-proxy, and the API server reaches its
// injector through the Service. docs/istio.md says why it is not a pod here.
const istiodIP = "10.96.0.20"

// istiodAddr is the address of istiod's CA and secure xDS port.
var istiodAddr = istiodIP + ":15012"

var (
	meshOnce sync.Once
	mesh     *istiod.Istiod
	meshErr  error
	// meshRootA and meshSignerA are istiod's plug-in CA at start: the root
	// TestProxylessMeshWithIstiod rotates away from.
	meshRootA, meshSignerA *istiod.CA
)

// controlPlane returns the cluster's istiod, started on first use with a plug-in CA
// (root A): the CA of every agent of the end-to-end tests, trusting the node agents' service accounts of the
// node-mode and sidecar tests for impersonation. runMain stops it before the cluster.
func controlPlane(t *testing.T) *istiod.Istiod {
	t.Helper()
	meshOnce.Do(func() {
		start := time.Now()
		mesh, meshErr = startIstiod(context.Background())
		if meshErr == nil {
			t.Logf("istiod ready %.1fs after start", time.Since(start).Seconds())
		}
	})
	if meshErr != nil {
		t.Fatalf("istiod: %v", meshErr)
	}
	return mesh
}

func startIstiod(ctx context.Context) (*istiod.Istiod, error) {
	core := kube.Client().CoreV1()
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: istiod.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "istiod", Namespace: istiod.Namespace},
		Spec: corev1.ServiceSpec{
			ClusterIP: istiodIP,
			Ports: []corev1.ServicePort{
				{Name: "grpc-xds", Port: istiod.XDSPort},
				{Name: "https-dns", Port: istiod.SecurePort},
				{Name: "https-webhook", Port: istiod.WebhookPort},
			},
		},
	}
	if _, err := core.Services(istiod.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("Service istiod: %w", err)
	}
	if err := kube.AddLocalAddress(istiodIP); err != nil {
		return nil, err
	}
	template, err := istiod.DocumentedTemplate()
	if err != nil {
		return nil, err
	}
	templates, err := documentedTemplates()
	if err != nil {
		return nil, err
	}
	templates["meshagent"] = template
	// The list docs/istio.md gives (the node agent of docs/kubernetes.md and
	// ambient's ztunnel), and the sidecar test's own node agent.
	trusted, err := documentedTrustedNodeAccounts()
	if err != nil {
		return nil, err
	}
	if meshRootA, err = istiod.NewCA("e2e root A", nil); err != nil {
		return nil, err
	}
	if meshSignerA, err = istiod.NewCA("e2e istiod A", meshRootA); err != nil {
		return nil, err
	}
	plugin := istiod.Plugin(meshSignerA, meshRootA, meshRootA)
	api := istiod.API{Client: kube.Client(), Config: kube.RESTConfig(), WriteKubeconfig: func(path string) error {
		b, err := os.ReadFile(kube.Kubeconfig())
		if err != nil {
			return err
		}
		return os.WriteFile(path, b, 0o600)
	}}
	return istiod.Start(ctx, api, istiod.Options{
		Host:                istiodIP,
		StandardPorts:       true,
		Netns:               kube.NetnsPath(),
		InNetns:             kube.InNetns,
		TrustedNodeAccounts: append(trusted, sidecarNamespace+"/"+sidecarRelease+"-meshagent-node"),
		StartTimeout:        3 * time.Minute,
		PluginCA:            &plugin,
		Injector:            &istiod.Injector{Templates: templates, Hub: proxyHub, Tag: proxyTag},
	})
}

// stopControlPlane stops istiod if a test started it.
func stopControlPlane() error {
	if mesh == nil {
		return nil
	}
	return mesh.Stop()
}

// waitRoots waits until istiod has published its roots in namespace.
func waitRoots(t *testing.T, ns string) []byte {
	t.Helper()
	ca := controlPlane(t)
	deadline := time.Now().Add(60 * time.Second)
	for {
		roots, err := ca.Roots(context.Background(), ns)
		if err == nil {
			return roots
		}
		if time.Now().After(deadline) {
			t.Fatalf("istiod published no roots in %s within 60 s: %v", ns, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

package istiod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/meshagent/meshagent/test/kubeenv"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// ManifestsDir is where scripts/tools.sh puts the pinned module's manifests:
// crds.yaml (every Istio CRD) and istio-discovery/ (the chart that renders
// istiod's injector ConfigMap from Istio's own injection templates).
func ManifestsDir() (string, error) {
	dir, err := kubeenv.ToolsDir()
	if err != nil {
		return "", err
	}
	dir = filepath.Join(dir, "istio-manifests")
	if _, err := os.Stat(filepath.Join(dir, "crds.yaml")); err != nil {
		return "", fmt.Errorf("istio manifests not found in %s: run make tools", dir)
	}
	return dir, nil
}

// applied remembers the API servers that have Istio's CRDs, by host.
var applied sync.Map

// ApplyCRDs creates Istio's CRDs (those of the pinned module) in the API
// server, keeping any already there, and waits until every one is served.
func ApplyCRDs(ctx context.Context, config *rest.Config) error {
	if _, ok := applied.Load(config.Host); ok {
		return nil
	}
	dir, err := ManifestsDir()
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(dir, "crds.yaml"))
	if err != nil {
		return fmt.Errorf("istiod: %w", err)
	}
	cfg := rest.CopyConfig(config)
	cfg.QPS, cfg.Burst = 200, 400
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("istiod: %w", err)
	}
	crds := dyn.Resource(crdResource)
	var names []string
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return fmt.Errorf("istiod: reading Istio's CRDs: %w", err)
		}
		if obj.GetKind() != "CustomResourceDefinition" {
			continue
		}
		names = append(names, obj.GetName())
		if _, err := crds.Create(ctx, &obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("istiod: creating CRD %s: %w", obj.GetName(), err)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("istiod: no CRD in %s", filepath.Join(dir, "crds.yaml"))
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, name := range names {
		for {
			obj, err := crds.Get(ctx, name, metav1.GetOptions{})
			if err == nil && established(obj) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("istiod: CRD %s not established within 60 s (%v)", name, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	applied.Store(config.Host, true)
	return nil
}

func established(obj *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

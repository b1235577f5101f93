package istiod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/meshagent/meshagent/test/kubeenv"
)

// InjectorConfigMap is the ConfigMap istiod's sidecar injector reads at start.
const InjectorConfigMap = "istio-sidecar-injector"

// Injector turns istiod's sidecar injector on: the ConfigMap the
// istio-discovery chart of the pinned module renders, with Istio's own
// templates and the extra ones given, is created before istiod starts.
type Injector struct {
	// Templates are added to Istio's (sidecarInjectorWebhook.templates), by name.
	Templates map[string]string
	// Hub and Tag name the proxy image (global.hub, global.tag): <Hub>/proxyv2:<Tag>.
	Hub, Tag string
}

// DocumentedTemplate is the injection template docs/kubernetes.md gives: the
// YAML block that sets sidecarInjectorWebhook.templates.meshagent. Tests
// inject with it, so the page and what is tested cannot differ.
func DocumentedTemplate() (string, error) {
	all, err := DocumentedTemplates("kubernetes.md")
	if err != nil {
		return "", err
	}
	if t := all["meshagent"]; t != "" {
		return t, nil
	}
	return "", errors.New("docs/kubernetes.md has no sidecarInjectorWebhook.templates.meshagent block")
}

// DocumentedTemplates returns the injection templates a page of docs/ gives
// (its YAML blocks setting sidecarInjectorWebhook.templates), by name.
func DocumentedTemplates(page string) (map[string]string, error) {
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "docs", page))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, block := range strings.Split(string(b), "```yaml\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if !strings.Contains(block, "sidecarInjectorWebhook:") {
			continue
		}
		var v struct {
			Values struct {
				SidecarInjectorWebhook struct {
					Templates map[string]string `json:"templates"`
				} `json:"sidecarInjectorWebhook"`
			} `json:"values"`
		}
		if err := yaml.Unmarshal([]byte(block), &v); err != nil {
			return nil, fmt.Errorf("docs/%s: an injection template block: %w", page, err)
		}
		for name, t := range v.Values.SidecarInjectorWebhook.Templates {
			out[name] = t
		}
	}
	return out, nil
}

// renderInjector renders the istio-discovery chart with helm and returns its
// injector ConfigMap.
func renderInjector(inj Injector, dir string) (*corev1.ConfigMap, error) {
	manifests, err := ManifestsDir()
	if err != nil {
		return nil, err
	}
	helm, err := kubeenv.ToolPath("helm")
	if err != nil {
		return nil, err
	}
	values := map[string]any{
		"global": map[string]any{"hub": inj.Hub, "tag": inj.Tag},
		"sidecarInjectorWebhook": map[string]any{
			"templates": inj.Templates,
		},
	}
	b, err := yaml.Marshal(values)
	if err != nil {
		return nil, err
	}
	valuesPath := filepath.Join(dir, "injector-values.yaml")
	if err := os.WriteFile(valuesPath, b, 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(helm, "template", "istiod", filepath.Join(manifests, "istio-discovery"),
		"--namespace", Namespace, "--values", valuesPath)
	cmd.Env = append(os.Environ(), "HOME="+dir, "HELM_CACHE_HOME="+filepath.Join(dir, "helm"),
		"HELM_CONFIG_HOME="+filepath.Join(dir, "helm"), "HELM_DATA_HOME="+filepath.Join(dir, "helm"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("istiod: helm template istio-discovery: %v\n%s", err, stderr.String())
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var cm corev1.ConfigMap
		if err := dec.Decode(&cm); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("istiod: reading the chart's output: %w", err)
		}
		if cm.Kind == "ConfigMap" && cm.Name == InjectorConfigMap {
			cm.Namespace = Namespace
			return &cm, nil
		}
	}
	return nil, fmt.Errorf("istiod: the istio-discovery chart rendered no ConfigMap %s", InjectorConfigMap)
}

// applyConfigMap creates cm, or replaces the one there.
func applyConfigMap(ctx context.Context, client kubernetes.Interface, cm *corev1.ConfigMap) error {
	cms := client.CoreV1().ConfigMaps(cm.Namespace)
	cm = cm.DeepCopy()
	cm.ResourceVersion = ""
	_, err := cms.Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		old, gerr := cms.Get(ctx, cm.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		cm.ResourceVersion = old.ResourceVersion
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("istiod: ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return nil
}

package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/agentproc"
)

// TestChartProxylessGivesTheWorkloadItsFiles renders the chart's proxyless
// shape (sidecar.envoy.enabled=false, xdsProxy on) as Istio's grpc-agent
// template has it: OUTPUT_CERTS=/var/lib/istio/data and
// GRPC_XDS_BOOTSTRAP=/etc/istio/proxy/grpc-bootstrap.json on emptyDir
// volumes the workload's container mounts too. Then it runs the agent
// binary with the rendered environment, each volume a directory under one
// root (the container's file system), and finds there what the workload
// reads: the certificate, key and roots, and a bootstrap whose certificate
// provider names them.
func TestChartProxylessGivesTheWorkloadItsFiles(t *testing.T) {
	const (
		dataDir   = "/var/lib/istio/data"
		bootstrap = "/etc/istio/proxy/grpc-bootstrap.json"
	)
	objs, err := render(t, "pl", "shop", "sidecar:\n  envoy:\n    enabled: false\n  containers:\n"+
		"    - name: app\n      image: registry.invalid/app:1\n      env:\n        - name: APP\n          value: \"1\"\n")
	if err != nil {
		t.Fatal(err)
	}
	pod := objs.deployment(t).Spec.Template.Spec
	agent := container(t, pod, "meshagent")
	app := container(t, pod, "app")
	checkEnv(t, agent, "DISABLE_ENVOY", "true")
	checkEnv(t, agent, "OUTPUT_CERTS", dataDir)
	checkEnv(t, agent, "GRPC_XDS_BOOTSTRAP", bootstrap)
	checkEnv(t, app, "GRPC_XDS_BOOTSTRAP", bootstrap)
	checkEnv(t, app, "APP", "1") // the workload's own env is kept
	emptyDir := func(v corev1.Volume) bool { return v.EmptyDir != nil }
	for _, c := range []corev1.Container{agent, app} {
		checkMount(t, pod, c, dataDir, emptyDir)
		checkMount(t, pod, c, filepath.Dir(bootstrap), emptyDir)
	}
	// The agent writes both directories; the workload only reads them.
	for _, m := range agent.VolumeMounts {
		if (m.MountPath == dataDir || m.MountPath == filepath.Dir(bootstrap)) && m.ReadOnly {
			t.Errorf("the agent mounts %s read-only", m.MountPath)
		}
	}

	// The container's file system: each of the agent's mounts is a
	// directory under root, and the agent runs in root as in "/".
	root := agentproc.TempDir(t)
	under := func(p string) string {
		for _, m := range agent.VolumeMounts {
			if p == m.MountPath || strings.HasPrefix(p, m.MountPath+"/") {
				return filepath.Join(root, p)
			}
		}
		return p
	}
	for _, m := range agent.VolumeMounts {
		if err := os.MkdirAll(filepath.Join(root, m.MountPath), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fields := map[string]string{
		"metadata.name": "pl-0", "metadata.namespace": "shop", "metadata.uid": "0b8a4c1e-8d4f-4f5e-9a57-3c1a2b9d7e61",
		"spec.serviceAccountName": pod.ServiceAccountName, "spec.nodeName": "node-a", "status.podIP": "10.0.0.9",
	}
	env := []string{"MESHAGENT_DEV=true", "STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1"}
	for _, e := range agent.Env {
		v := e.Value
		if e.ValueFrom != nil {
			v = fields[e.ValueFrom.FieldRef.FieldPath]
		}
		if e.Name != "STATUS_PORT" {
			env = append(env, e.Name+"="+under(v))
		}
	}
	p := agentproc.Start(t, root, env...)

	certFile := filepath.Join(root, dataDir, "cert-chain.pem")
	var bs struct {
		CertificateProviders map[string]struct {
			PluginName string `json:"plugin_name"`
			Config     struct {
				CertificateFile   string `json:"certificate_file"`
				PrivateKeyFile    string `json:"private_key_file"`
				CACertificateFile string `json:"ca_certificate_file"`
			} `json:"config"`
		} `json:"certificate_providers"`
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(root, bootstrap))
		_, certErr := os.Stat(certFile)
		if err == nil && certErr == nil {
			if err := json.Unmarshal(b, &bs); err != nil {
				t.Fatalf("bootstrap: %v\n%s", err, b)
			}
			break
		}
		select {
		case <-p.Done():
			t.Fatalf("the agent exited (%d) before writing the bootstrap and certificates", p.ExitCode())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s: bootstrap %v, certificate %v", err, certErr)
		}
	}
	prov, ok := bs.CertificateProviders["default"]
	if !ok || prov.PluginName != "file_watcher" {
		t.Fatalf("bootstrap certificate providers %+v, want a file_watcher named default", bs.CertificateProviders)
	}
	for name, path := range map[string]string{
		"certificate_file":    prov.Config.CertificateFile,
		"private_key_file":    prov.Config.PrivateKeyFile,
		"ca_certificate_file": prov.Config.CACertificateFile,
	} {
		if filepath.Dir(path) != filepath.Join(root, dataDir) {
			t.Errorf("%s = %s, want a file in OUTPUT_CERTS %s", name, path, filepath.Join(root, dataDir))
			continue
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	chain, err := os.ReadFile(prov.Config.CertificateFile)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ParseCertificates(chain)
	if err != nil {
		t.Fatal(err)
	}
	if want := "spiffe://cluster.local/ns/shop/sa/" + pod.ServiceAccountName; len(certs[0].URIs) != 1 || certs[0].URIs[0].String() != want {
		t.Errorf("certificate SANs %v, want %s", certs[0].URIs, want)
	}
	// The workload runs as another uid with the pod's fsGroup: the key
	// must be readable by the group.
	if st, err := os.Stat(prov.Config.PrivateKeyFile); err != nil {
		t.Error(err)
	} else if st.Mode().Perm()&0o040 == 0 {
		t.Errorf("key %s has mode %v, want it group-readable", prov.Config.PrivateKeyFile, st.Mode())
	}
}

// writeKubeconfig writes a kubeconfig naming the test API server into dir
// and returns its path.
func writeKubeconfig(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "kubeconfig")
	kc := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"" + kube.Host() + "\", insecure-skip-tls-verify: true}}]\n" +
		"users: [{name: u, user: {token: \"" + kube.AdminToken() + "\"}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeCARoot writes a root certificate where the chart mounts the CA
// root, under dir as the container's "/".
func writeCARoot(t *testing.T, dir string) {
	t.Helper()
	ca, err := localca.New(localca.Config{Name: "chart test CA"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "var/run/secrets/istio/root-cert.pem")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, ca.RootPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestChartPrometheusRule: off by default; on, a PrometheusRule holding
// files/prometheus-rules.yaml (docs/metrics.md's example alerts).
func TestChartPrometheusRule(t *testing.T) {
	objs, err := render(t, "mon", "shop", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "PrometheusRule" {
			t.Fatal("a PrometheusRule by default")
		}
	}
	objs, err = render(t, "mon", "shop", "prometheusRule:\n  enabled: true\n  labels:\n    release: prom\n")
	if err != nil {
		t.Fatal(err)
	}
	var rule map[string]any
	for _, o := range objs {
		if o.GetKind() == "PrometheusRule" {
			rule = o.Object
			if o.GetLabels()["release"] != "prom" || o.GetNamespace() != "shop" {
				t.Errorf("labels %v namespace %s", o.GetLabels(), o.GetNamespace())
			}
		}
	}
	if rule == nil {
		t.Fatal("no PrometheusRule with prometheusRule.enabled=true")
	}
	b, err := os.ReadFile(filepath.Join(chartDir, "files", "prometheus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := yaml.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(rule["spec"])
	wantJSON, _ := json.Marshal(want)
	if string(got) != string(wantJSON) {
		t.Errorf("spec %s\nwant %s", got, wantJSON)
	}
}

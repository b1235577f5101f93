package deploy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3" // HttpProtocolOptions in the bootstrap
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/heavy"
	"github.com/meshagent/meshagent/test/kubeenv"
)

const chartDir = "helm/meshagent"

var kube *kubeenv.Env

func TestMain(m *testing.M) {
	if heavy.Short() { // every test here runs helm, which helm() skips
		os.Exit(m.Run())
	}
	env, err := kubeenv.Start(context.Background(), kubeenv.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kube = env
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the API server:", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestHelmLint(t *testing.T) {
	for name, values := range map[string]string{
		"defaults": "",
		"node":     "sidecar:\n  enabled: false\nnode:\n  enabled: true\n",
		"linkerd":  "caProvider: Linkerd\ncredentialFetcherType: TokenRequest\nnode:\n  enabled: true\n",
	} {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir}
			if values != "" {
				args = append(args, "--values", writeValues(t, values))
			}
			if out, err := helm(t, args...); err != nil {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
		})
	}
}

// TestChartAcceptedByAPIServer renders the chart for each way of installing it, has
// the API server validate every object (server-side dry run, unknown fields refused),
// checks what the contract requires of the pods, then creates the service accounts
// and RBAC objects for real and asks the API server what they allow.
func TestChartAcceptedByAPIServer(t *testing.T) {
	type access struct {
		verb, resource, subresource, namespace, name string
		allowed                                      bool
	}
	tests := []struct {
		name   string
		values string
		kinds  []string
		check  func(t *testing.T, objs objects)
		// access of the agent's service account ("" = the workload's, "node" = the node agent's).
		access map[string][]access
	}{{
		name:   "sidecar",
		values: "",
		kinds:  []string{"ConfigMap", "Deployment", "ServiceAccount"},
		check: func(t *testing.T, objs objects) {
			pod := objs.deployment(t).Spec.Template.Spec
			checkSidecarPod(t, pod, "istio-ca")
			if *pod.AutomountServiceAccountToken {
				t.Error("JWT sidecar mounts API credentials it does not need")
			}
			agent := container(t, pod, "meshagent")
			checkEnv(t, agent, "CREDENTIAL_FETCHER_TYPE", "JWT")
			checkMount(t, pod, agent, "/var/run/secrets/tokens", func(v corev1.Volume) bool {
				p := v.Projected
				return p != nil && len(p.Sources) == 1 && p.Sources[0].ServiceAccountToken != nil &&
					p.Sources[0].ServiceAccountToken.Audience == "istio-ca" &&
					p.Sources[0].ServiceAccountToken.Path == "istio-token"
			})
		},
		access: map[string][]access{"": {
			{verb: "create", resource: "serviceaccounts", subresource: "token", name: "$sa"},
			{verb: "list", resource: "pods"},
		}},
	}, {
		name:   "sidecar-tokenrequest",
		values: "credentialFetcherType: TokenRequest\ntoken:\n  lifetime: 30m\n",
		kinds:  []string{"ConfigMap", "Deployment", "Role", "RoleBinding", "ServiceAccount"},
		check: func(t *testing.T, objs objects) {
			pod := objs.deployment(t).Spec.Template.Spec
			checkSidecarPod(t, pod, "")
			if !*pod.AutomountServiceAccountToken {
				t.Error("TokenRequest sidecar has no API credentials")
			}
			agent := container(t, pod, "meshagent")
			checkEnv(t, agent, "CREDENTIAL_FETCHER_TYPE", "TokenRequest")
			checkEnv(t, agent, "MESHAGENT_TOKEN_LIFETIME", "30m")
			checkEnvFrom(t, agent, "POD_UID", "metadata.uid")
			for _, v := range pod.Volumes {
				if v.Projected != nil {
					t.Errorf("TokenRequest sidecar still mounts a projected token (volume %s)", v.Name)
				}
			}
		},
		access: map[string][]access{"": {
			{verb: "create", resource: "serviceaccounts", subresource: "token", name: "$sa", allowed: true},
			{verb: "create", resource: "serviceaccounts", subresource: "token", name: "other"},
			{verb: "get", resource: "serviceaccounts", name: "$sa"},
			{verb: "list", resource: "pods"},
		}},
	}, {
		name: "sidecar-proxyless-linkerd",
		values: "caProvider: Linkerd\ncaRoot:\n  configMap: linkerd-identity-trust-roots\n  key: ca-bundle.crt\n" +
			"sidecar:\n  envoy:\n    enabled: false\n  containers:\n    - name: app\n      image: registry.invalid/app:1\n",
		kinds: []string{"Deployment", "ServiceAccount"},
		check: func(t *testing.T, objs objects) {
			pod := objs.deployment(t).Spec.Template.Spec
			agent := container(t, pod, "meshagent")
			checkEnv(t, agent, "CA_PROVIDER", "Linkerd")
			checkEnv(t, agent, "DISABLE_ENVOY", "true")
			container(t, pod, "app")
			checkNativeSidecar(t, pod, "")
			for _, c := range pod.Containers {
				if c.Name == "envoy" {
					t.Error("envoy rendered with sidecar.envoy.enabled=false")
				}
			}
			checkMount(t, pod, agent, "/var/run/secrets/tokens", func(v corev1.Volume) bool {
				p := v.Projected
				return p != nil && p.Sources[0].ServiceAccountToken.Audience == "identity.l5d.io"
			})
			checkMount(t, pod, agent, "/var/run/secrets/istio", func(v corev1.Volume) bool {
				c := v.ConfigMap
				return c != nil && c.Name == "linkerd-identity-trust-roots" &&
					len(c.Items) == 1 && c.Items[0].Key == "ca-bundle.crt" && c.Items[0].Path == "root-cert.pem"
			})
		},
	}, {
		name:   "node",
		values: "sidecar:\n  enabled: false\nnode:\n  enabled: true\n",
		kinds:  []string{"CSIDriver", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "DaemonSet", "ServiceAccount", "ServiceAccount"},
		check: func(t *testing.T, objs objects) {
			checkNodePod(t, objs, "istio-ca")
			role := objs.clusterRole(t)
			want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}}
			if fmt.Sprint(role.Rules) != fmt.Sprint(want) {
				t.Errorf("node ClusterRole rules %v, want exactly %v", role.Rules, want)
			}
		},
		access: map[string][]access{"node": {
			{verb: "list", resource: "pods", allowed: true},
			{verb: "watch", resource: "pods", namespace: "elsewhere", allowed: true},
			{verb: "get", resource: "secrets"},
			{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: "elsewhere", name: "app"},
			{verb: "create", resource: "serviceaccounts", subresource: "token", name: "$sa"},
		}, "node-socket": {
			// The socket holder and the CSI driver need no API at all.
			{verb: "list", resource: "pods"},
			{verb: "get", resource: "secrets"},
			{verb: "create", resource: "serviceaccounts", subresource: "token", name: "$sa"},
		}},
	}, {
		name:   "node-tokenrequest",
		values: "credentialFetcherType: TokenRequest\nsidecar:\n  enabled: false\nnode:\n  enabled: true\n",
		kinds:  []string{"CSIDriver", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "DaemonSet", "Role", "RoleBinding", "ServiceAccount", "ServiceAccount"},
		check: func(t *testing.T, objs objects) {
			checkNodePod(t, objs, "")
		},
		access: map[string][]access{"node": {
			{verb: "list", resource: "pods", allowed: true},
			{verb: "create", resource: "serviceaccounts", subresource: "token", name: "$sa", allowed: true},
			{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: "elsewhere", name: "app"},
		}},
	}, {
		name:   "node-linkerd-and-sidecar",
		values: "caProvider: Linkerd\nnode:\n  enabled: true\n",
		kinds:  []string{"CSIDriver", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "DaemonSet", "Deployment", "ServiceAccount", "ServiceAccount", "ServiceAccount"},
		check: func(t *testing.T, objs objects) {
			checkNodePod(t, objs, "identity.l5d.io")
			checkPodTokenHandOver(t, objs)
		},
		access: map[string][]access{
			"node": {
				{verb: "list", resource: "pods", allowed: true},
				// Linkerd has no impersonation: the node agent presents a token of
				// each workload's own service account, which the kubelet hands
				// the node's CSI driver: the agent creates none.
				{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: "elsewhere", name: "app"},
				{verb: "create", resource: "serviceaccounts", subresource: "token", name: "$sa"},
				{verb: "get", resource: "secrets"},
			},
			"": {
				{verb: "create", resource: "serviceaccounts", subresource: "token", name: "$sa"},
			},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			ns := newNamespace(t, tt.name)
			objs, err := render(t, tt.name, ns, tt.values)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.GetKind())
			}
			slices.Sort(kinds)
			if !slices.Equal(kinds, tt.kinds) {
				t.Errorf("rendered kinds %v, want %v", kinds, tt.kinds)
			}
			if err := apply(ctx, ns, objs, true); err != nil {
				t.Fatalf("API server refused the chart:\n%v", err)
			}
			tt.check(t, objs)

			// Create the identities and RBAC for real and ask what they allow.
			var rbac objects
			for _, o := range objs {
				if o.GetAPIVersion() == "rbac.authorization.k8s.io/v1" || o.GetKind() == "ServiceAccount" {
					rbac = append(rbac, o)
				}
			}
			if err := apply(ctx, ns, rbac, false); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { deleteClusterScoped(rbac) })
			// The authorizer sees new RBAC objects through its caches a moment after
			// they are created: wait for every grant first, so that a refusal checked
			// afterwards is a real one, not a cache that has not caught up.
			for _, wantAllowed := range []bool{true, false} {
				for who, checks := range tt.access {
					sa := objs.serviceAccount(t, who)
					for _, a := range checks {
						if a.allowed != wantAllowed {
							continue
						}
						a.namespace = cmp.Or(a.namespace, ns)
						if a.name == "$sa" {
							a.name = sa
						}
						if got := allowed(t, ns, sa, a.verb, a.resource, a.subresource, a.namespace, a.name, a.allowed); got != a.allowed {
							t.Errorf("%s may %s %s/%s %s/%s: %v, want %v", sa, a.verb, a.resource, a.subresource, a.namespace, a.name, got, a.allowed)
						}
					}
				}
			}
		})
	}
}

// TestInstallUpgradeUninstall installs the chart with helm into the API server, reads
// its notes, upgrades it from JWT to TokenRequest and back (the Role follows), and
// uninstalls it (the cluster-wide RBAC goes with it).
func TestInstallUpgradeUninstall(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "upgrade")
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kube.Kubeconfig(kubeconfig, kube.AdminToken()); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := helm(t, append(args, "--kubeconfig", kubeconfig, "--namespace", ns)...)
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", args[0], err, out)
		}
		return string(out)
	}
	roles := func() int {
		t.Helper()
		list, err := kube.Client().RbacV1().Roles(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Items)
	}

	notes := run("install", "mesh", chartDir, "--set", "node.enabled=true")
	for _, want := range []string{
		"spiffe://cluster.local/ns/" + ns + "/sa/mesh-meshagent-workload",
		ns + "/mesh-meshagent-node to istiod's CA_TRUSTED_NODE_ACCOUNTS",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("install notes do not say %q:\n%s", want, notes)
		}
	}
	if _, err := kube.Client().AppsV1().DaemonSets(ns).Get(ctx, "mesh-meshagent-node", metav1.GetOptions{}); err != nil {
		t.Errorf("DaemonSet after install: %v", err)
	}
	if n := roles(); n != 0 {
		t.Errorf("%d Roles with JWT, want none", n)
	}

	run("upgrade", "mesh", chartDir, "--reuse-values", "--set", "credentialFetcherType=TokenRequest")
	if n := roles(); n != 2 {
		t.Errorf("%d Roles after the upgrade to TokenRequest, want 2 (workload's and node agent's own token)", n)
	}
	d, err := kube.Client().AppsV1().Deployments(ns).Get(ctx, "mesh-meshagent-workload", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !*d.Spec.Template.Spec.AutomountServiceAccountToken {
		t.Error("Deployment not upgraded: still no API credentials with TokenRequest")
	}

	run("upgrade", "mesh", chartDir, "--reuse-values", "--set", "credentialFetcherType=JWT")
	if n := roles(); n != 0 {
		t.Errorf("%d Roles after the upgrade back to JWT, want none", n)
	}

	run("uninstall", "mesh")
	if _, err := kube.Client().RbacV1().ClusterRoles().Get(ctx, "mesh-meshagent-node", metav1.GetOptions{}); err == nil {
		t.Error("ClusterRole left behind by uninstall")
	}
}

// TestChartEnvIsAgentConfig runs the built agent's `meshagent config` with the
// environment each rendered agent container gets (downward API values filled in as a
// kubelet would): the agent must accept every value, and read every variable the
// chart sets as one of its settings.
func TestChartEnvIsAgentConfig(t *testing.T) {
	heavy.Skip(t, "runs the built agent")
	bin, err := agentproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, kind, values string }{
		{"sidecar", "Deployment", ""},
		{"sidecar-tokenrequest", "Deployment", "credentialFetcherType: TokenRequest\ntoken:\n  lifetime: 30m\n  audience: mesh-ca\ncaAddress: ca.mesh.svc:15012\n"},
		{"sidecar-proxyless-linkerd", "Deployment", "caProvider: Linkerd\nclusterID: ''\nsidecar:\n  envoy:\n    enabled: false\n"},
		{"node", "DaemonSet", "sidecar:\n  enabled: false\nnode:\n  enabled: true\n"},
		{"node-broker", "DaemonSet", "sidecar:\n  enabled: false\nnode:\n  enabled: true\n  broker:\n    enabled: true\n    brokers: spiffe://cluster.local/ns/istio-system/sa/ztunnel=pod\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := render(t, "cfg", "shop", tt.values)
			if err != nil {
				t.Fatal(err)
			}
			var pod corev1.PodSpec
			if tt.kind == "DaemonSet" {
				pod = objs.daemonSet(t, "node").Spec.Template.Spec
			} else {
				pod = objs.deployment(t).Spec.Template.Spec
			}
			fields := map[string]string{
				"metadata.name":           "cfg-0",
				"metadata.namespace":      "shop",
				"metadata.uid":            "0b8a4c1e-8d4f-4f5e-9a57-3c1a2b9d7e61",
				"spec.serviceAccountName": pod.ServiceAccountName,
				"spec.nodeName":           "node-a",
				"status.podIP":            "10.0.0.9",
			}
			agent := container(t, pod, "meshagent")
			env := []string{"PATH=" + os.Getenv("PATH")}
			set := map[string]string{}
			for _, e := range agent.Env {
				v := e.Value
				if e.ValueFrom != nil {
					var ok bool
					if v, ok = fields[e.ValueFrom.FieldRef.FieldPath]; !ok {
						t.Fatalf("%s from unexpected field %s", e.Name, e.ValueFrom.FieldRef.FieldPath)
					}
				}
				env = append(env, e.Name+"="+v)
				set[e.Name] = v
			}
			// config checks what run checks: the files the chart mounts
			// (the CA root) and an API server to talk to are there.
			cmd := exec.Command(bin, "config")
			cmd.Dir = t.TempDir()
			cmd.Env = append(env, "KUBECONFIG="+writeKubeconfig(t, cmd.Dir))
			writeCARoot(t, cmd.Dir)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("meshagent config refused the chart's environment: %v\n%s", err, out)
			}
			fromEnv := map[string]bool{}
			known := map[string]bool{}
			for _, line := range strings.Split(string(out), "\n") {
				if f := strings.Fields(line); len(f) >= 3 {
					known[f[0]] = true
					fromEnv[f[0]] = f[2] == "env"
				}
			}
			for name := range set {
				switch {
				case fromEnv[name]:
				case known[name]:
					t.Errorf("%s is set by the chart but meshagent config does not show it from env:\n%s", name, out)
				default:
					t.Errorf("the chart sets %s, which is no setting of the agent", name)
				}
			}
			if tt.kind == "DaemonSet" {
				// The node agent runs in node mode on the node it is scheduled to.
				if set["MESHAGENT_MODE"] != "node" || set["NODE_NAME"] != fields["spec.nodeName"] {
					t.Errorf("DaemonSet env MESHAGENT_MODE=%q NODE_NAME=%q, want node and the pod's spec.nodeName", set["MESHAGENT_MODE"], set["NODE_NAME"])
				}
				for _, line := range strings.Split(string(out), "\n") {
					f := strings.Fields(line)
					if len(f) >= 3 && (f[0] == "MESHAGENT_MODE" && f[1] != "node" || f[0] == "NODE_NAME" && f[1] != "node-a") {
						t.Errorf("meshagent config resolved %s", line)
					}
				}
			}
		})
	}
}

// TestDryRunRefusesInvalidObjects shows the validation above can fail: values that
// helm renders without complaint but that make an invalid or unknown field.
func TestDryRunRefusesInvalidObjects(t *testing.T) {
	for _, tt := range []struct{ name, values, want string }{
		{"negative replicas", "sidecar:\n  replicas: -1\n", "spec.replicas"},
		{"unknown field", "sidecar:\n  securityContext:\n    readOnlyRootFilesystm: true\n", "unknown field"},
		{"bad update strategy", "node:\n  enabled: true\n  updateStrategy:\n    type: Sometimes\n", "updateStrategy"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ns := newNamespace(t, "invalid")
			objs, err := render(t, "invalid", ns, tt.values)
			if err != nil {
				t.Fatal(err)
			}
			err = apply(context.Background(), ns, objs, true)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("dry run of invalid objects: err = %v, want one naming %q", err, tt.want)
			}
		})
	}
}

func TestChartRefusesBadValues(t *testing.T) {
	for _, tt := range []struct{ values, want string }{
		{"caProvider: Vault\n", "caProvider must be Citadel or Linkerd"},
		{"credentialFetcherType: GoogleComputeEngine\n", "credentialFetcherType must be JWT or TokenRequest"},
		{"sidecar:\n  enabled: false\nnode:\n  enabled: true\n  broker:\n    enabled: true\n", "node.broker.brokers: list the brokers"},
		{"sidecar:\n  terminationDrainDuration: 5\n", "sidecar.terminationDrainDuration must be seconds"},
		{"sidecar:\n  terminationDrainDuration: 1m\n", "sidecar.terminationDrainDuration must be seconds"},
		{"sidecar:\n  terminationDrainDuration: 30s\n  terminationGracePeriodSeconds: 30\n", "must be longer than sidecar.terminationDrainDuration"},
	} {
		_, err := render(t, "bad", "default", tt.values)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("values %q: err = %v, want %q", tt.values, err, tt.want)
		}
	}
}

// TestEnvoyBootstrapIsValid parses the rendered Envoy bootstrap as Envoy's own types
// and runs their validation rules.
func TestEnvoyBootstrapIsValid(t *testing.T) {
	objs, err := render(t, "envoy", "default", "")
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	objs.find(t, "ConfigMap", &cm)
	js, err := yaml.YAMLToJSON([]byte(cm.Data["bootstrap.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("bootstrap does not parse: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("bootstrap invalid: %v", err)
	}
	pipes := map[string]string{}
	for _, c := range b.GetStaticResources().GetClusters() {
		pipes[c.GetName()] = c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath()
	}
	want := map[string]string{
		"sds-grpc": "/var/run/secrets/workload-spiffe-uds/socket",
		"xds-grpc": "/etc/istio/proxy/XDS",
	}
	if fmt.Sprint(pipes) != fmt.Sprint(want) {
		t.Errorf("bootstrap clusters' sockets %v, want %v", pipes, want)
	}
}

// checkSidecarPod checks what the agent's paths and status probes require of the
// sidecar pod (docs/kubernetes.md, docs/operations.md): the agent and
// Envoy share the SDS socket directory on an emptyDir, the token (when projected, with
// audience) and CA root are at the agent's default paths, the status port probes, and
// every container runs non-root with a read-only root file system.
func checkSidecarPod(t *testing.T, pod corev1.PodSpec, audience string) {
	t.Helper()
	agent := container(t, pod, "meshagent")
	envoy := container(t, pod, "envoy")
	if agent.WorkingDir != "/" {
		t.Errorf("agent working directory %q, want / (its default paths are relative)", agent.WorkingDir)
	}
	for _, c := range []corev1.Container{agent, envoy} {
		checkMount(t, pod, c, "/var/run/secrets/workload-spiffe-uds", func(v corev1.Volume) bool {
			return v.Name == "workload-socket" && v.EmptyDir != nil
		})
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container %s: security context %+v, want read-only root, no privilege escalation", c.Name, sc)
		}
	}
	if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("pod security context %+v, want runAsNonRoot", psc)
	}
	checkMount(t, pod, agent, "/var/run/secrets/istio", func(v corev1.Volume) bool {
		return v.ConfigMap != nil && v.ConfigMap.Items[0].Path == "root-cert.pem"
	})
	if audience != "" {
		checkMount(t, pod, agent, "/var/run/secrets/tokens", func(v corev1.Volume) bool {
			return v.Projected != nil && v.Projected.Sources[0].ServiceAccountToken.Audience == audience
		})
	}
	checkProbes(t, agent)
	checkNativeSidecar(t, pod, "5s")
}

// checkNativeSidecar checks that the sidecar pod runs the agent as a native
// sidecar (docs/operations.md, "Termination"): the first init container,
// restartPolicy Always, with a startup probe on /healthz/started (readiness
// but for the xDS proxy's check, which only the workload's own stream can
// pass), so that every container of the pod starts after it holds its
// certificates and stops before it; the
// drain is PROXY_CONFIG's terminationDrainDuration ("" where the agent does
// not drain: proxyless), and the pod's grace period is longer than it.
func checkNativeSidecar(t *testing.T, pod corev1.PodSpec, drain string) {
	t.Helper()
	if len(pod.InitContainers) == 0 || pod.InitContainers[0].Name != "meshagent" {
		t.Fatalf("init containers %v, want meshagent first", names(pod.InitContainers))
	}
	agent := pod.InitContainers[0]
	if agent.RestartPolicy == nil || *agent.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("agent restart policy %v, want Always (a native sidecar)", agent.RestartPolicy)
	}
	if p := agent.StartupProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz/started" || p.HTTPGet.Port.StrVal != "status" {
		t.Errorf("agent startup probe %+v, want GET /healthz/started on the status port", p)
	}
	for _, c := range pod.Containers {
		if c.Name == "meshagent" {
			t.Errorf("the agent is also a regular container")
		}
	}
	if len(pod.Containers) == 0 {
		t.Error("no container for the agent to serve")
	}
	var pc struct {
		TerminationDrainDuration string `json:"terminationDrainDuration"`
	}
	for _, e := range agent.Env {
		if e.Name == "PROXY_CONFIG" {
			if err := yaml.Unmarshal([]byte(e.Value), &pc); err != nil {
				t.Fatalf("PROXY_CONFIG %q: %v", e.Value, err)
			}
		}
	}
	if pc.TerminationDrainDuration != drain {
		t.Errorf("PROXY_CONFIG terminationDrainDuration %q, want %q", pc.TerminationDrainDuration, drain)
	}
	if drain == "" {
		return
	}
	d, err := time.ParseDuration(drain)
	if err != nil {
		t.Fatal(err)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= d {
		t.Errorf("terminationGracePeriodSeconds %v, want longer than the %s drain", g, drain)
	}
}

func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

func checkNodePod(t *testing.T, objs objects, audience string) {
	t.Helper()
	pod := objs.daemonSet(t, "node").Spec.Template.Spec
	sockPod := objs.daemonSet(t, "node-socket").Spec.Template.Spec
	if !pod.HostPID {
		t.Error("node agent without hostPID cannot map callers' PIDs to pods")
	}
	agent := container(t, pod, "meshagent")
	checkEnv(t, agent, "MESHAGENT_MODE", "node")
	checkEnvFrom(t, agent, "NODE_NAME", "spec.nodeName")
	checkMount(t, pod, agent, "/var/run/secrets/workload-spiffe-uds", func(v corev1.Volume) bool {
		return v.HostPath != nil && v.HostPath.Path == "/var/run/meshagent" &&
			v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathDirectoryOrCreate
	})
	if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == ""
	}) {
		t.Errorf("node agent tolerations %v, want one tolerating every taint", pod.Tolerations)
	}
	checkNodeAgentPrivileges(t, pod, agent)
	checkSocketPod(t, objs, sockPod, pod, agent)
	if audience != "" {
		checkMount(t, pod, agent, "/var/run/secrets/tokens", func(v corev1.Volume) bool {
			return v.Projected != nil && v.Projected.Sources[0].ServiceAccountToken.Audience == audience
		})
	}
	checkProbes(t, agent)
	checkCSI(t, objs, sockPod, pod)
}

// checkCSI checks the CSI driver's container (in the node socket pod, not the
// agent's) and object: the only privileged part, mounting the kubelet's pods
// directory with Bidirectional propagation and the socket directory read-only;
// ephemeral inline volumes only.
func checkCSI(t *testing.T, objs objects, pod, agentPod corev1.PodSpec) {
	t.Helper()
	c := container(t, pod, "csi")
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Errorf("csi container security context %+v: Bidirectional propagation needs privileged", sc)
	}
	for _, ac := range agentPod.Containers {
		if ac.Name == "csi" {
			t.Error("the CSI driver runs in the agent's pod: it goes away with every agent upgrade")
		}
	}
	if sc := container(t, agentPod, "meshagent").SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
		t.Error("the agent container is privileged")
	}
	// The privileged container gets no API token: the pod mounts none by itself,
	// and only the agent container mounts the projected API credentials.
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the node socket pod automounts an API token into every container, the privileged CSI one included")
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount" || m.Name == "kube-api-access" {
			t.Errorf("the csi container mounts API credentials (%s at %s)", m.Name, m.MountPath)
		}
	}
	checkMount(t, agentPod, container(t, agentPod, "meshagent"), "/var/run/secrets/kubernetes.io/serviceaccount", func(v corev1.Volume) bool {
		p := v.Projected
		return p != nil && len(p.Sources) == 3 && p.Sources[0].ServiceAccountToken != nil && p.Sources[0].ServiceAccountToken.Audience == "" &&
			p.Sources[1].ConfigMap != nil && p.Sources[1].ConfigMap.Name == "kube-root-ca.crt"
	})
	if len(c.Args) == 0 || c.Args[0] != "csi" {
		t.Errorf("csi container args %v, want the csi subcommand", c.Args)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	if m := mounts["/var/lib/kubelet/pods"]; m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("csi container mounts the kubelet's pods directory as %+v, want Bidirectional", m)
	}
	if m, ok := mounts["/var/run/secrets/workload-spiffe-uds"]; !ok || !m.ReadOnly {
		t.Errorf("csi container mounts the socket directory as %+v, want read-only", m)
	}
	for _, p := range []string{"/var/lib/kubelet/plugins/csi.meshagent.io", "/var/lib/kubelet/plugins_registry"} {
		if _, ok := mounts[p]; !ok {
			t.Errorf("csi container does not mount %s", p)
		}
	}
	var d storagev1.CSIDriver
	objs.find(t, "CSIDriver", &d)
	if d.Name != "csi.meshagent.io" || d.Spec.AttachRequired == nil || *d.Spec.AttachRequired ||
		!slices.Equal(d.Spec.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}) {
		t.Errorf("CSIDriver %s %+v, want csi.meshagent.io, no attach, Ephemeral only", d.Name, d.Spec)
	}
}

// checkPodTokenHandOver checks the Linkerd node chart's token path: the
// CSIDriver asks the kubelet for each pod's identity.l5d.io token and its
// pod UID and republishes to refresh it; the CSI driver writes it into the
// host directory the init container made the agent's, which the agent
// reads (read-only) as MESHAGENT_NODE_POD_TOKENS_DIR.
func checkPodTokenHandOver(t *testing.T, objs objects) {
	t.Helper()
	var d storagev1.CSIDriver
	objs.find(t, "CSIDriver", &d)
	if len(d.Spec.TokenRequests) != 1 || d.Spec.TokenRequests[0].Audience != "identity.l5d.io" ||
		d.Spec.RequiresRepublish == nil || !*d.Spec.RequiresRepublish || d.Spec.PodInfoOnMount == nil || !*d.Spec.PodInfoOnMount {
		t.Errorf("CSIDriver spec %+v, want tokenRequests [identity.l5d.io], requiresRepublish and podInfoOnMount", d.Spec)
	}
	pod := objs.daemonSet(t, "node").Spec.Template.Spec
	sockPod := objs.daemonSet(t, "node-socket").Spec.Template.Spec
	const dir = "/var/run/meshagent/pod-tokens"
	hostDir := func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == dir }
	agent, csi := container(t, pod, "meshagent"), container(t, sockPod, "csi")
	checkEnv(t, agent, "MESHAGENT_NODE_POD_TOKENS_DIR", dir)
	checkMount(t, pod, agent, dir, hostDir)
	checkMount(t, sockPod, csi, dir, hostDir)
	for _, m := range agent.VolumeMounts {
		if m.MountPath == dir && !m.ReadOnly {
			t.Error("the agent mounts the token directory writable")
		}
	}
	if !slices.Contains(csi.Args, "--token-dir="+dir) || !slices.Contains(csi.Args, "--token-audience=identity.l5d.io") {
		t.Errorf("csi args %v, want --token-dir=%s --token-audience=identity.l5d.io", csi.Args, dir)
	}
	for _, p := range []corev1.PodSpec{pod, sockPod} {
		if init := p.InitContainers; len(init) == 0 || init[0].Name != "socket-dir" || !slices.Contains(init[0].Args, "--private-dir="+dir) {
			t.Errorf("init containers %+v, want the socket-dir one to make %s the agent's", init, dir)
		}
	}
}

// TestChartFixesFromARealNode renders what a real node showed to be wrong: the release
// name the docs use doubled "-node", a boolean in extraEnv failed the install, the Envoy
// image followed the agent's pull policy, and the sidecar could not run without the xDS
// proxy (so it was never ready without a control plane).
func TestChartFixesFromARealNode(t *testing.T) {
	ns := newNamespace(t, "fixes")
	values := "node:\n  enabled: true\nistiodSAN: istiod.istio-system.svc\n" +
		"extraEnv:\n  - name: MESHAGENT_NODE_FILE_RESOURCES\n    value: true\n  - name: SECRET_TTL\n    value: 12h\n" +
		"image:\n  pullPolicy: Never\nsidecar:\n  xdsProxy: false\n  envoy:\n    pullPolicy: Always\n"
	objs, err := render(t, "meshagent-node", ns, values)
	if err != nil {
		t.Fatal(err)
	}
	if err := apply(context.Background(), ns, objs, true); err != nil {
		t.Fatalf("API server refused the chart:\n%v", err)
	}
	ds := objs.daemonSet(t, "node")
	if ds.Name != "meshagent-node" {
		t.Errorf("release meshagent-node named its DaemonSet %q", ds.Name)
	}
	agent := container(t, ds.Spec.Template.Spec, "meshagent")
	checkEnv(t, agent, "MESHAGENT_NODE_FILE_RESOURCES", "true")
	checkEnv(t, agent, "SECRET_TTL", "12h")
	checkEnv(t, agent, "ISTIOD_SAN", "istiod.istio-system.svc")
	var dep appsv1.Deployment
	objs.find(t, "Deployment", &dep)
	pod := dep.Spec.Template.Spec
	checkEnv(t, container(t, pod, "meshagent"), "MESHAGENT_XDS_PROXY", "false")
	if p := container(t, pod, "meshagent").ImagePullPolicy; p != corev1.PullNever {
		t.Errorf("agent pull policy %s, want Never", p)
	}
	if p := container(t, pod, "envoy").ImagePullPolicy; p != corev1.PullAlways {
		t.Errorf("envoy pull policy %s, want its own Always", p)
	}

	// No Envoy and no xDS proxy: the agent serves its socket to the workload
	// (DISABLE_ENVOY would turn the socket off, as for proxyless gRPC).
	objs, err = render(t, "plain", ns, "sidecar:\n  xdsProxy: false\n  envoy:\n    enabled: false\n")
	if err != nil {
		t.Fatal(err)
	}
	objs.find(t, "Deployment", &dep)
	agent = container(t, dep.Spec.Template.Spec, "meshagent")
	checkEnv(t, agent, "MESHAGENT_XDS_PROXY", "false")
	for _, e := range agent.Env {
		if e.Name == "DISABLE_ENVOY" {
			t.Errorf("DISABLE_ENVOY=%s with the xDS proxy off: the workload would get no socket", e.Value)
		}
	}
}

// checkNodeAgentPrivileges: the node agent runs as a non-root uid with no
// capability (it holds every pod's keys; reading other processes' cgroups and
// SO_PEERCRED need none once the pod shares the host's PID namespace), and the
// only root step is the init container that gives it the socket's host
// directory, with CAP_CHOWN alone.
func checkNodeAgentPrivileges(t *testing.T, pod corev1.PodSpec, agent corev1.Container) {
	t.Helper()
	sc := agent.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0 || sc.RunAsGroup == nil || *sc.RunAsGroup == 0 ||
		sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Fatalf("node agent security context %+v, want a non-root uid and group", sc)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged != nil && *sc.Privileged {
		t.Errorf("node agent security context %+v, want every capability dropped, none added, no escalation, a read-only root", sc)
	}
	if len(pod.InitContainers) != 1 {
		t.Fatalf("node agent init containers %v, want socket-dir alone (the socket holder has a pod of its own)", pod.InitContainers)
	}
	checkSocketDirInit(t, pod, *sc.RunAsUser, *sc.RunAsGroup)
}

// checkSocketDirInit: the pod's first init container is socket-dir, giving the
// socket's host directory and the socket holder's private one (and, with
// Linkerd, the pods' token directory) to the agent's uid, with CAP_CHOWN alone.
func checkSocketDirInit(t *testing.T, pod corev1.PodSpec, uid, gid int64) {
	t.Helper()
	init := pod.InitContainers[0]
	want := []string{"socket-dir", fmt.Sprintf("--owner=%d:%d", uid, gid), "--private-dir=/var/run/meshagent-handoff", "/var/run/secrets/workload-spiffe-uds"}
	if slices.Contains(init.Args, "--private-dir=/var/run/meshagent/pod-tokens") {
		// With Linkerd, the same step makes the pods' token directory the agent's
		// (checkPodTokenHandOver).
		want = slices.Insert(want, 2, "--private-dir=/var/run/meshagent/pod-tokens")
	}
	if init.Name != "socket-dir" || !slices.Equal(init.Args, want) {
		t.Errorf("init container %s args %v, want socket-dir with %v", init.Name, init.Args, want)
	}
	isc := init.SecurityContext
	if isc == nil || isc.Capabilities == nil || !slices.Equal(isc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		!slices.Equal(isc.Capabilities.Add, []corev1.Capability{"CHOWN"}) || isc.AllowPrivilegeEscalation == nil || *isc.AllowPrivilegeEscalation ||
		isc.Privileged != nil && *isc.Privileged {
		t.Errorf("socket-dir init container security context %+v, want CAP_CHOWN alone", isc)
	}
	checkMount(t, pod, init, "/var/run/secrets/workload-spiffe-uds", func(v corev1.Volume) bool { return v.HostPath != nil })
}

// checkSocketPod: the node socket DaemonSet (docs/node-mode.md, "Restarts")
// runs the socket holder and the CSI driver apart from the agent's pod, so that
// an upgrade of the agent leaves them running (its own update strategy,
// OnDelete); it shares no PID namespace with the node and mounts no API token.
// The holder is as unprivileged as the agent and shares with it the socket
// directory and a private host directory where the agent finds it
// (MESHAGENT_SOCKET_HANDOFF).
func checkSocketPod(t *testing.T, objs objects, pod, agentPod corev1.PodSpec, agent corev1.Container) {
	t.Helper()
	ds := objs.daemonSet(t, "node-socket")
	if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("node socket DaemonSet update strategy %+v, want OnDelete: an upgrade must not take the socket and the driver away with the agent", ds.Spec.UpdateStrategy)
	}
	if pod.HostPID {
		t.Error("the node socket pod shares the host's PID namespace: the holder could see and signal the agent")
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the node socket pod automounts an API token")
	}
	for _, c := range append(slices.Clone(agentPod.InitContainers), agentPod.Containers...) {
		if c.Name == "socket-holder" {
			t.Error("the socket holder runs in the agent's pod: it goes away with every agent upgrade")
		}
	}
	h := container(t, pod, "socket-holder")
	if len(h.Args) == 0 || h.Args[0] != "socket-holder" {
		t.Fatalf("socket holder args %v", h.Args)
	}
	if !reflect.DeepEqual(h.SecurityContext, agent.SecurityContext) {
		t.Errorf("socket holder security context %+v, want the agent's %+v", h.SecurityContext, agent.SecurityContext)
	}
	if len(pod.InitContainers) != 1 {
		t.Fatalf("node socket init containers %v, want socket-dir alone", pod.InitContainers)
	}
	checkSocketDirInit(t, pod, *agent.SecurityContext.RunAsUser, *agent.SecurityContext.RunAsGroup)
	var private string
	for _, a := range h.Args {
		if v, ok := strings.CutPrefix(a, "--private="); ok {
			private = v
		}
	}
	var handoff string
	for _, e := range agent.Env {
		if e.Name == "MESHAGENT_SOCKET_HANDOFF" {
			handoff = e.Value
		}
	}
	if private == "" || handoff != private {
		t.Errorf("the holder listens at %q, the agent's MESHAGENT_SOCKET_HANDOFF is %q", private, handoff)
	}
	var hostDir string
	for _, v := range pod.Volumes {
		for _, m := range h.VolumeMounts {
			if m.Name == v.Name && m.MountPath == filepath.Dir(private) && v.HostPath != nil {
				hostDir = v.HostPath.Path
			}
		}
	}
	if hostDir == "" {
		t.Fatalf("the holder's private directory %s is no host directory", filepath.Dir(private))
	}
	sameHostDir := func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == hostDir }
	checkMount(t, agentPod, agent, filepath.Dir(private), sameHostDir)
	checkMount(t, pod, h, "/var/run/secrets/workload-spiffe-uds", func(v corev1.Volume) bool {
		return v.HostPath != nil && v.HostPath.Path == "/var/run/meshagent"
	})
	if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == ""
	}) {
		t.Errorf("node socket tolerations %v, want the agent's, tolerating every taint", pod.Tolerations)
	}
}

func checkProbes(t *testing.T, c corev1.Container) {
	t.Helper()
	if len(c.Ports) != 1 || c.Ports[0].Name != "status" || c.Ports[0].ContainerPort != 15020 {
		t.Errorf("agent ports %v, want status 15020", c.Ports)
	}
	for probe, want := range map[*corev1.Probe]string{c.ReadinessProbe: "/healthz/ready", c.LivenessProbe: "/healthz/live"} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != want || probe.HTTPGet.Port.StrVal != "status" {
			t.Errorf("probe %+v, want GET %s on the status port", probe, want)
		}
	}
}

// container returns the pod's container (or init container, native sidecars
// included) of that name.
func container(t *testing.T, pod corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range append(slices.Clone(pod.Containers), pod.InitContainers...) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s in the pod", name)
	return corev1.Container{}
}

// checkMount checks that c mounts, at path, a volume of the pod that ok accepts.
func checkMount(t *testing.T, pod corev1.PodSpec, c corev1.Container, path string, ok func(corev1.Volume) bool) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != path {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name {
				if !ok(v) {
					t.Errorf("container %s: volume %s at %s is not as expected: %+v", c.Name, v.Name, path, v.VolumeSource)
				}
				return
			}
		}
		t.Errorf("container %s mounts undeclared volume %s", c.Name, m.Name)
		return
	}
	t.Errorf("container %s mounts nothing at %s", c.Name, path)
}

func checkEnv(t *testing.T, c corev1.Container, name, want string) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			if e.Value != want {
				t.Errorf("container %s: %s=%q, want %q", c.Name, name, e.Value, want)
			}
			return
		}
	}
	t.Errorf("container %s: %s not set, want %q", c.Name, name, want)
}

func checkEnvFrom(t *testing.T, c corev1.Container, name, fieldPath string) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != fieldPath {
				t.Errorf("container %s: %s from %+v, want the downward API's %s", c.Name, name, e.ValueFrom, fieldPath)
			}
			return
		}
	}
	t.Errorf("container %s: %s not set, want the downward API's %s", c.Name, name, fieldPath)
}

// objects are rendered manifests.
type objects []*unstructured.Unstructured

// find converts the only object of kind into out.
func (objs objects) find(t *testing.T, kind string, out any) {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s rendered, want 1", len(found), kind)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(found[0].Object, out); err != nil {
		t.Fatal(err)
	}
}

// daemonSet converts the only DaemonSet of component ("node": the agent's;
// "node-socket": the socket holder's and the CSI driver's).
func (objs objects) daemonSet(t *testing.T, component string) appsv1.DaemonSet {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" && o.GetLabels()["app.kubernetes.io/component"] == component {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d DaemonSets of component %s rendered, want 1", len(found), component)
	}
	var ds appsv1.DaemonSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(found[0].Object, &ds); err != nil {
		t.Fatal(err)
	}
	return ds
}

func (objs objects) deployment(t *testing.T) appsv1.Deployment {
	var d appsv1.Deployment
	objs.find(t, "Deployment", &d)
	return d
}

func (objs objects) clusterRole(t *testing.T) rbacv1.ClusterRole {
	var r rbacv1.ClusterRole
	objs.find(t, "ClusterRole", &r)
	return r
}

// serviceAccount returns the name of the workload's ("") or node agent's ("node")
// service account, as the rendered pod template uses it.
func (objs objects) serviceAccount(t *testing.T, who string) string {
	t.Helper()
	if who == "node" || who == "node-socket" {
		return objs.daemonSet(t, who).Spec.Template.Spec.ServiceAccountName
	}
	return objs.deployment(t).Spec.Template.Spec.ServiceAccountName
}

// render runs helm template for a release in namespace with the given values YAML.
func render(t *testing.T, release, namespace, values string) (objects, error) {
	t.Helper()
	heavy.Skip(t, "uses the API server and helm")
	out, err := helm(t, "template", release, chartDir, "--namespace", namespace, "--values", writeValues(t, values))
	if err != nil {
		return nil, fmt.Errorf("helm template: %w\n%s", err, out)
	}
	var objs objects
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var o unstructured.Unstructured
		if err := dec.Decode(&o.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("parsing helm's output: %w", err)
		}
		if o.Object != nil {
			objs = append(objs, &o)
		}
	}
	return objs, nil
}

// apply creates every object in the API server, with dryRun only validated: unknown or
// duplicate fields are refused (strict field validation), as is anything the server's
// validation or admission refuses. Errors name the object.
func apply(ctx context.Context, namespace string, objs objects, dryRun bool) error {
	dyn, err := dynamic.NewForConfig(kube.Config())
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(kube.Client().Discovery()))
	opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var errs []error
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err))
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if o.GetNamespace() != namespace {
				errs = append(errs, fmt.Errorf("%s %s: namespace %q, want the release's %q", gvk.Kind, o.GetName(), o.GetNamespace(), namespace))
				continue
			}
			ri = dyn.Resource(mapping.Resource).Namespace(namespace)
		}
		if _, err := ri.Create(ctx, o, opts); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

func deleteClusterScoped(objs objects) {
	client := kube.Client().RbacV1()
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRole":
			client.ClusterRoles().Delete(context.Background(), o.GetName(), metav1.DeleteOptions{})
		case "ClusterRoleBinding":
			client.ClusterRoleBindings().Delete(context.Background(), o.GetName(), metav1.DeleteOptions{})
		case "ValidatingAdmissionPolicy":
			kube.Client().AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(context.Background(), o.GetName(), metav1.DeleteOptions{})
		case "ValidatingAdmissionPolicyBinding":
			kube.Client().AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(context.Background(), o.GetName(), metav1.DeleteOptions{})
		}
	}
}

// allowed asks the API server whether service account sa of namespace ns may do verb.
// When waitFor is true it asks again, for up to rbacPropagation, until the answer is
// yes: RBAC objects just created reach the authorizer through its informers.
func allowed(t *testing.T, ns, sa, verb, resource, subresource, namespace, name string, waitFor bool) bool {
	t.Helper()
	heavy.Skip(t, "uses the API server and helm")
	ctx, cancel := context.WithTimeout(context.Background(), rbacPropagation)
	defer cancel()
	for {
		r, err := kube.Client().AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   "system:serviceaccount:" + ns + ":" + sa,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: verb, Resource: resource, Subresource: subresource, Namespace: namespace, Name: name,
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		if r.Status.Allowed || !waitFor {
			return r.Status.Allowed
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// rbacPropagation bounds the wait for a new grant to reach the authorizer.
const rbacPropagation = 10 * time.Second

func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	heavy.Skip(t, "uses the API server and helm")
	ns, err := kube.Client().CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kube.Client().CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

func writeValues(t *testing.T, values string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// helm runs the helm binary built by make tools, with its cache and configuration in
// a temporary directory so nothing outside the test is read or written.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	heavy.Skip(t, "runs helm")
	bin, err := kubeenv.ToolPath("helm")
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	return cmd.CombinedOutput()
}

// nodeAgentAllowed is every permission a node agent may ever be given, whatever the
// values: a grant outside it fails TestNodeAgentPermissions. names is what the
// rule's resourceNames must be ("" = any, "$sa" = the agent's own service account,
// "$signer" = the Pod Certificates signer).
var nodeAgentAllowed = []struct{ group, resource, verb, names string }{
	{"", "pods", "list", ""},
	{"", "pods", "watch", ""},
	{"", "serviceaccounts/token", "create", "$sa"},
	{"certificates.k8s.io", "signers", "sign", "$signer"},
	{"certificates.k8s.io", "podcertificaterequests", "list", ""},
	{"certificates.k8s.io", "podcertificaterequests", "watch", ""},
	{"certificates.k8s.io", "podcertificaterequests/status", "update", ""},
}

// TestNodeAgentPermissions renders the chart for every node-mode choice and checks
// every rule of every role bound to the node agent against nodeAgentAllowed; then,
// with Pod Certificates on, creates the RBAC for real and asks the API server: the
// node agent may sign and nothing of trust (no attest, no ClusterTrustBundle
// write), and the trust publisher may attest and write the signer's bundle alone.
func TestNodeAgentPermissions(t *testing.T) {
	const signer = "meshagent.io/workload-identity"
	const bundle = "meshagent.io:workload-identity:mesh-roots"
	for name, values := range map[string]string{
		"node":              "sidecar:\n  enabled: false\nnode:\n  enabled: true\n",
		"node-tokenrequest": "credentialFetcherType: TokenRequest\nsidecar:\n  enabled: false\nnode:\n  enabled: true\n",
		"node-linkerd":      "caProvider: Linkerd\nsidecar:\n  enabled: false\nnode:\n  enabled: true\n",
		"node-podcert":      "sidecar:\n  enabled: false\nnode:\n  enabled: true\n  podCertificateSigner: " + signer + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			ns := newNamespace(t, name)
			objs, err := render(t, name, ns, values)
			if err != nil {
				t.Fatal(err)
			}
			sa := objs.serviceAccount(t, "node")
			rules := rulesBoundTo(t, objs, ns, sa)
			if len(rules) == 0 {
				t.Fatal("no rule bound to the node agent")
			}
			for _, r := range rules {
				for _, g := range r.APIGroups {
					for _, res := range r.Resources {
						for _, v := range r.Verbs {
							if !nodeAgentMay(g, res, v, r.ResourceNames, sa, signer) {
								t.Errorf("the node agent is granted %s %s/%s names %v: not in the allow-list", v, g, res, r.ResourceNames)
							}
						}
					}
				}
				if len(r.NonResourceURLs) != 0 {
					t.Errorf("the node agent is granted non-resource URLs %v", r.NonResourceURLs)
				}
			}
			t.Logf("node agent rules (%s):\n%s", name, formatRules(rules))
			if name != "node-podcert" {
				return
			}

			var dep appsv1.Deployment
			objs.find(t, "Deployment", &dep)
			pub := dep.Spec.Template.Spec.ServiceAccountName
			c := container(t, dep.Spec.Template.Spec, "trust-publisher")
			if !slices.Equal(c.Args, []string{"trust-publisher", "--signer=" + signer, "--roots=/var/run/secrets/istio/root-cert.pem", "--log-level=info"}) {
				t.Errorf("trust publisher args %v", c.Args)
			}
			if pub == sa || dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
				t.Errorf("trust publisher runs as %q with %v replicas, want its own service account and one replica", pub, dep.Spec.Replicas)
			}
			ctx := context.Background()
			if err := apply(ctx, ns, objs, true); err != nil {
				t.Fatalf("API server refused the chart:\n%v", err)
			}
			var rbac objects
			for _, o := range objs {
				if o.GetAPIVersion() == "rbac.authorization.k8s.io/v1" || o.GetKind() == "ServiceAccount" {
					rbac = append(rbac, o)
				}
			}
			if err := apply(ctx, ns, rbac, false); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { deleteClusterScoped(rbac) })
			const certs = "certificates.k8s.io"
			checks := []struct {
				sa                   string
				verb, resource, name string
				allowed              bool
			}{
				{sa, "sign", "signers", signer, true},
				{pub, "attest", "signers", signer, true},
				{pub, "update", "clustertrustbundles", bundle, true},
				{pub, "create", "clustertrustbundles", "", true},
				{sa, "attest", "signers", signer, false},
				{sa, "create", "clustertrustbundles", "", false},
				{sa, "update", "clustertrustbundles", bundle, false},
				{sa, "delete", "clustertrustbundles", bundle, false},
				{pub, "update", "clustertrustbundles", "other", false},
				{pub, "sign", "signers", signer, false},
				{pub, "attest", "signers", "example.com/other", false},
				{pub, "list", "pods", "", false},
			}
			// Grants first (the authorizer's caches catch up), then refusals.
			for _, wantAllowed := range []bool{true, false} {
				for _, ck := range checks {
					if ck.allowed != wantAllowed {
						continue
					}
					group := certs
					if ck.resource == "pods" {
						group = ""
					}
					if got := allowedIn(t, ns, ck.sa, group, ck.verb, ck.resource, ck.name, ck.allowed); got != ck.allowed {
						t.Errorf("%s may %s %s %q: %v, want %v", ck.sa, ck.verb, ck.resource, ck.name, got, ck.allowed)
					}
				}
			}
		})
	}
}

func nodeAgentMay(group, resource, verb string, names []string, sa, signer string) bool {
	for _, a := range nodeAgentAllowed {
		if a.group != group || a.resource != resource || a.verb != verb {
			continue
		}
		switch a.names {
		case "":
			if len(names) == 0 {
				return true
			}
		case "$sa":
			if slices.Equal(names, []string{sa}) {
				return true
			}
		case "$signer":
			if slices.Equal(names, []string{signer}) {
				return true
			}
		}
	}
	return false
}

// rulesBoundTo returns the rules of every rendered Role and ClusterRole that a
// rendered binding grants to service account sa of ns.
func rulesBoundTo(t *testing.T, objs objects, ns, sa string) []rbacv1.PolicyRule {
	t.Helper()
	roles := map[string][]rbacv1.PolicyRule{}
	for _, o := range objs {
		if k := o.GetKind(); k == "Role" || k == "ClusterRole" {
			var r rbacv1.ClusterRole
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
				t.Fatal(err)
			}
			roles[k+"/"+o.GetName()] = r.Rules
		}
	}
	var out []rbacv1.PolicyRule
	for _, o := range objs {
		if k := o.GetKind(); k != "RoleBinding" && k != "ClusterRoleBinding" {
			continue
		}
		var b rbacv1.RoleBinding
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == ns
		}) {
			continue
		}
		rules, ok := roles[b.RoleRef.Kind+"/"+b.RoleRef.Name]
		if !ok {
			t.Errorf("binding %s refers to %s %s, which the chart does not render", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		out = append(out, rules...)
	}
	return out
}

func formatRules(rules []rbacv1.PolicyRule) string {
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "  groups=%v resources=%v names=%v verbs=%v\n", r.APIGroups, r.Resources, r.ResourceNames, r.Verbs)
	}
	return b.String()
}

// allowedIn is allowed for a resource of an API group, cluster-scoped.
func allowedIn(t *testing.T, ns, sa, group, verb, resource, name string, waitFor bool) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rbacPropagation)
	defer cancel()
	for {
		r, err := kube.Client().AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               "system:serviceaccount:" + ns + ":" + sa,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Group: group, Verb: verb, Resource: resource, Name: name},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		if r.Status.Allowed || !waitFor {
			return r.Status.Allowed
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestChartResources: every container of the agent, the node agent, its CSI
// driver and its socket holder renders the requests and limits values.yaml
// gives it (each with the measured figure it comes from, docs/operations.md,
// "Sizing"): a CPU and memory request, a memory limit above the request and
// no CPU limit.
func TestChartResources(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	valuesAt := func(path ...string) corev1.ResourceRequirements {
		t.Helper()
		var v any = values
		for _, p := range path {
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("values.yaml has no %v", path)
			}
			v = m[p]
		}
		js, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var r corev1.ResourceRequirements
		if err := yaml.UnmarshalStrict(js, &r); err != nil {
			t.Fatalf("values.yaml %v: %v", path, err)
		}
		return r
	}
	objs, err := render(t, "res", "default", "node:\n  enabled: true\n")
	if err != nil {
		t.Fatal(err)
	}
	sidecar, node := objs.deployment(t).Spec.Template.Spec, objs.daemonSet(t, "node").Spec.Template.Spec
	socketPod := objs.daemonSet(t, "node-socket").Spec.Template.Spec
	for _, tt := range []struct {
		what      string
		pod       corev1.PodSpec
		container string
		values    []string
	}{
		{"sidecar agent", sidecar, "meshagent", []string{"sidecar", "resources"}},
		{"node agent", node, "meshagent", []string{"node", "resources"}},
		{"CSI driver", socketPod, "csi", []string{"node", "csi", "resources"}},
		{"socket holder", socketPod, "socket-holder", []string{"node", "socketHolder", "resources"}},
	} {
		t.Run(tt.what, func(t *testing.T) {
			want := valuesAt(tt.values...)
			got := container(t, tt.pod, tt.container).Resources
			if !reflect.DeepEqual(normalise(got), normalise(want)) {
				t.Errorf("resources %v, want values.yaml's %v", got, want)
			}
			req, lim := got.Requests[corev1.ResourceMemory], got.Limits[corev1.ResourceMemory]
			if got.Requests.Cpu().IsZero() || req.IsZero() || lim.IsZero() || lim.Cmp(req) <= 0 {
				t.Errorf("resources %v: want CPU and memory requests and a larger memory limit", got)
			}
			if _, ok := got.Limits[corev1.ResourceCPU]; ok {
				t.Errorf("a CPU limit (%v): throttling delays certificates", got.Limits.Cpu())
			}
		})
	}
}

// normalise writes quantities in canonical form, for comparison.
func normalise(r corev1.ResourceRequirements) map[string]string {
	out := map[string]string{}
	for k, q := range r.Requests {
		out["requests."+string(k)] = q.String()
	}
	for k, q := range r.Limits {
		out["limits."+string(k)] = q.String()
	}
	return out
}

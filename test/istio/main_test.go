// Package istio runs meshagent against Istio's own control plane: istiod
// (pilot-discovery built from the pinned istio.io/istio module, test/istiod)
// against a real API server (test/kubeenv), as the CA, the xDS server behind
// the agent's proxy, the trust source and the node authorizer. No stand-in
// for any Istio part: what istiod accepts, answers and refuses here is what
// it does in a cluster. docs/istio.md has the settings each shape needs.
package istio

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/test/istiod"
	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/podproc"
)

// kube is the package's API server, started by the first test that needs it.
var kube = &kubeenv.Shared{}

func TestMain(m *testing.M) {
	podproc.RunFetchChild()
	os.Exit(kube.Main(m))
}

const (
	// nodeAgentNamespace and nodeAgentSA are the node agent's service account,
	// the one istiod's CA_TRUSTED_NODE_ACCOUNTS names.
	nodeAgentNamespace = "istio-nodes"
	nodeAgentSA        = "meshagent"
)

var (
	meshOnce sync.Once
	mesh     *istiod.Istiod
	meshErr  error
	// meshExtraRoot is a root the mesh config lists in caCertificates: istiod
	// adds it to the trust bundle it sends as ProxyConfig, and to nothing else.
	meshExtraRoot []byte
)

// control returns the package's istiod, started on first use with the node
// agent's service account trusted for impersonation and one extra root in
// its mesh config; it stops after the package's tests, before the API server.
func control(t *testing.T) *istiod.Istiod {
	t.Helper()
	env := kube.Env(t)
	meshOnce.Do(func() {
		var extra *istiod.CA
		if extra, meshErr = istiod.NewCA("mesh-config extra root", nil); meshErr != nil {
			return
		}
		meshExtraRoot = extra.CertPEM
		var docs string
		if docs, meshErr = istiod.DocumentedTemplate(); meshErr != nil {
			return
		}
		var istioDocs map[string]string
		if istioDocs, meshErr = istiod.DocumentedTemplates("istio.md"); meshErr != nil {
			return
		}
		templates := map[string]string{"meshagent": docs, "meshagent-containers": containersTemplate}
		for name, tmpl := range istioDocs {
			templates[name] = tmpl
		}
		indented := "    " + strings.ReplaceAll(strings.TrimSpace(string(meshExtraRoot)), "\n", "\n    ")
		start := time.Now()
		mesh, meshErr = istiod.Start(context.Background(), istiod.APIOf(env), istiod.Options{
			TrustedNodeAccounts: []string{nodeAgentNamespace + "/" + nodeAgentSA},
			MeshConfig:          "caCertificates:\n- pem: |\n" + indented + "\n",
			Injector: &istiod.Injector{
				Templates: templates,
				Hub:       "meshagent.test", Tag: "e2e",
			},
		})
		if meshErr == nil {
			rss, _ := mesh.RSS()
			t.Logf("istiod ready in %v, VmRSS %.0f MB", time.Since(start).Round(time.Millisecond), float64(rss)/1e6)
			kube.OnStop(mesh.Stop)
		}
	})
	if meshErr != nil {
		t.Fatalf("starting istiod: %v", meshErr)
	}
	return mesh
}

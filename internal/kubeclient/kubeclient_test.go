package kubeclient

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func writeKubeconfig(t *testing.T, path, server, token string) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}

func TestRESTConfig(t *testing.T) {
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		t.Fatal("the test runs in a pod: the in-cluster configuration would be found")
	}
	dir := t.TempDir()
	one, two := filepath.Join(dir, "one"), filepath.Join(dir, "two")
	writeKubeconfig(t, one, "https://127.0.0.1:6443", "tok-one")
	writeKubeconfig(t, two, "https://127.0.0.1:7443", "tok-two")

	rc, err := RESTConfig(Config{Kubeconfig: one, UserAgent: "meshagent/test"})
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://127.0.0.1:6443" || rc.BearerToken != "tok-one" || rc.UserAgent != "meshagent/test" {
		t.Errorf("config host %q token %q agent %q", rc.Host, rc.BearerToken, rc.UserAgent)
	}
	// A list, as KUBECONFIG: the first file that sets a value wins.
	rc, err = RESTConfig(Config{Kubeconfig: two + string(os.PathListSeparator) + one})
	if err != nil || rc.Host != "https://127.0.0.1:7443" {
		t.Errorf("list: %v, host %q", err, rc.Host)
	}
	if _, err := New(Config{Kubeconfig: one}); err != nil {
		t.Errorf("New: %v", err)
	}

	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("clusters: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no configuration", Config{}, "KUBECONFIG is not set and the agent does not run in a pod"},
		{"not YAML", Config{Kubeconfig: bad}, "loading kubeconfig " + bad},
		{"missing file", Config{Kubeconfig: filepath.Join(dir, "absent")}, "loading kubeconfig " + filepath.Join(dir, "absent")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := RESTConfig(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one with %q", err, tt.want)
			}
		})
	}
}

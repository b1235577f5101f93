package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/internal/localca"
)

// A TokenRequest configuration that cannot work stops the agent at start-up
// with exit code 2 and a line that says why.
func TestTokenRequestConfigurationErrorsExit2(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	ca, err := localca.New(localca.Config{Name: "tokens test root"})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root-cert.pem")
	if err := os.WriteFile(root, ca.RootPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"POD_NAMESPACE=shop", "SERVICE_ACCOUNT=web", "STATUS_PORT=0", "CA_ADDR=127.0.0.1:1", "CA_ROOT_CA=" + root, "CREDENTIAL_FETCHER_TYPE=TokenRequest"}
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"no pod name", nil, "CREDENTIAL_FETCHER_TYPE=TokenRequest needs POD_NAME: tokens are bound to the pod"},
		{"no API configuration", []string{"POD_NAME=web-0"}, "no Kubernetes API configuration: KUBECONFIG is not set and the agent does not run in a pod"},
		{"missing kubeconfig", []string{"POD_NAME=web-0", "KUBECONFIG=" + filepath.Join(dir, "absent")}, "CREDENTIAL_FETCHER_TYPE=TokenRequest: KUBECONFIG=" + filepath.Join(dir, "absent") + " cannot be used"},
		{"lifetime below the API minimum", []string{"POD_NAME=web-0", "MESHAGENT_TOKEN_LIFETIME=9m"}, `invalid MESHAGENT_TOKEN_LIFETIME="9m": want at least 10m0s`},
		{"unknown fetcher", []string{"CREDENTIAL_FETCHER_TYPE=GoogleComputeEngine"}, `invalid CREDENTIAL_FETCHER_TYPE="GoogleComputeEngine": accepted: JWT, TokenRequest`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
				t.Fatal("the test runs in a pod: the in-cluster configuration would be found")
			}
			var stderr bytes.Buffer
			code := run(context.Background(), []string{"run"}, append(append([]string(nil), tt.env...), base...), io.Discard, &stderr) // the first occurrence wins
			if code != exitConfig {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr lacks %q:\n%s", tt.want, stderr.String())
			}
		})
	}
}

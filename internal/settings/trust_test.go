package settings

import (
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseConfigMapRef(t *testing.T) {
	t.Parallel()
	tests := []struct {
		raw  string
		want ConfigMapRef
		bad  bool
	}{
		{raw: "", want: ConfigMapRef{}},
		{raw: "istio-system/istio-ca-root-cert", want: ConfigMapRef{"istio-system", "istio-ca-root-cert", "root-cert.pem"}},
		{raw: "linkerd/linkerd-identity-trust-roots/ca-bundle.crt", want: ConfigMapRef{"linkerd", "linkerd-identity-trust-roots", "ca-bundle.crt"}},
		{raw: "ns/a.b/K_1"},
		{raw: "ns", bad: true},
		{raw: "ns/", bad: true},
		{raw: "/name", bad: true},
		{raw: "ns/name/", bad: true},
		{raw: "ns/name/key/more", bad: true},
		{raw: "NS/name", bad: true},
		{raw: "ns/Name", bad: true},
		{raw: "ns/name/a b", bad: true},
		{raw: "ns/name/..", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			got, err := ParseConfigMapRef(tt.raw)
			if (err != nil) != tt.bad {
				t.Fatalf("error %v, want bad %v", err, tt.bad)
			}
			if !tt.bad && tt.want != (ConfigMapRef{}) && got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestSignerName(t *testing.T) {
	t.Parallel()
	v := SignerName(func(c *Config) *string { return &c.TrustBundleSigner })
	for raw, ok := range map[string]bool{
		"": true,
		"clusterissuers.cert-manager.io/istio-ca": true,
		"istio.io/cluster-trust-bundle/x":         true,
		"nodomain":                                false,
		"example.com/":                            false,
		"Example.com/x":                           false,
		"example.com/a:b":                         false,
		"example.com/a b":                         false,
	} {
		if err := v.set(&Config{}, raw); (err == nil) != ok {
			t.Errorf("%q: error %v, want ok %v", raw, err, ok)
		}
	}
}

// pilot-agent's remaining certificate and xDS-proxy settings are honoured,
// said to have no effect at start-up, or refused with one line.
func TestPilotAgentSettingsHonouredOrRefused(t *testing.T) {
	t.Parallel()
	noAddrs := func() ([]net.Addr, error) { return nil, nil }
	sock := filepath.Join(t.TempDir(), "socket")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tests := []struct {
		env     []string
		refused string // a part of the error line
		warned  string // the setting named in a start-up warning
	}{
		{env: []string{"PKCS8_KEY=true"}},
		{env: []string{"PKCS8_KEY=false"}, warned: "PKCS8_KEY"},
		{env: []string{"XDS_AUTH_PROVIDER=gcp"}, refused: `invalid XDS_AUTH_PROVIDER="gcp": not supported`},
		{env: []string{"XDS_AUTH_PLAINTEXT=false"}},
		{env: []string{"XDS_AUTH_PLAINTEXT=true"}, refused: `invalid XDS_AUTH_PLAINTEXT="true": true is not supported`},
		{env: []string{"PROXY_CONFIG_XDS_AGENT=true"}},
		{env: []string{"PROXY_CONFIG_XDS_AGENT=true", "MESHAGENT_XDS_PROXY=false"}, warned: "PROXY_CONFIG_XDS_AGENT"},
		{env: []string{"PROXY_CONFIG_XDS_AGENT=true", "ISTIO_MULTIROOT_MESH=true"}},
		{env: []string{"PROXY_CONFIG_XDS_AGENT=false"}},
		{env: []string{"ISTIO_MULTIROOT_MESH=true"}, warned: "ISTIO_MULTIROOT_MESH"},
		{env: []string{"ISTIO_MULTIROOT_MESH=true", "MESHAGENT_TRUST_CONFIGMAP=istio-system/istio-ca-root-cert"}},
		{env: []string{"MESHAGENT_CREDENTIAL_UDS_SOCKET=" + sock}, warned: "MESHAGENT_CREDENTIAL_UDS_SOCKET"},
		{env: []string{"MESHAGENT_CREDENTIAL_UDS_SOCKET=" + filepath.Join(t.TempDir(), "none")}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.env, " "), func(t *testing.T) {
			c, err := Resolve(Input{Env: tt.env, FileExists: func(string) bool { return false }, InterfaceAddrs: noAddrs})
			if tt.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tt.refused) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("error %v, want one line with %q", err, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var warned []string
			for _, w := range c.Warnings() {
				warned = append(warned, w.Name)
			}
			if want := []string{tt.warned}; tt.warned == "" && len(warned) != 0 || tt.warned != "" && !slices.Equal(warned, want) {
				t.Errorf("warnings %v, want %q", warned, tt.warned)
			}
		})
	}
}

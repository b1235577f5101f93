package settings

import "testing"

func TestParseConfigMapRef(t *testing.T) {
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

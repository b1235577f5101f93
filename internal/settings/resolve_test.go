package settings

import (
	"errors"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
)

func resolve(t *testing.T, env []string, flags map[string]string) *Config {
	t.Helper()
	noAddrs := func() ([]net.Addr, error) { return nil, nil }
	c, err := Resolve(Input{Env: env, Flags: flags, FileExists: func(string) bool { return false }, InterfaceAddrs: noAddrs})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	return c
}

func row(t *testing.T, c *Config, name string) Row {
	t.Helper()
	for _, r := range c.Table() {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no row %s", name)
	return Row{}
}

func TestRegistryIsConsistent(t *testing.T) {
	names, flags := map[string]bool{}, map[string]bool{}
	for _, s := range Registry {
		if names[s.Name] {
			t.Errorf("%s declared twice", s.Name)
		}
		names[s.Name] = true
		if s.Flag != "" {
			if flags[s.Flag] {
				t.Errorf("flag --%s declared twice", s.Flag)
			}
			flags[s.Flag] = true
			if strings.HasPrefix(s.Flag, "-") || strings.ContainsAny(s.Flag, " =_") {
				t.Errorf("%s: bad flag name %q", s.Name, s.Flag)
			}
		}
		if s.Doc == "" || !strings.HasSuffix(s.Doc, ".") {
			t.Errorf("%s: doc string missing or not a sentence", s.Name)
		}
		if s.Value.get == nil || s.Value.Type == "" || s.Value.Accepted == "" {
			t.Errorf("%s: incomplete Value", s.Name)
		}
		_, isPrefix := s.Prefix()
		if isPrefix != strings.HasSuffix(s.Name, "<NAME>") || (!isPrefix && s.Value.set == nil) {
			t.Errorf("%s: prefix settings must be named <PREFIX><NAME> and use Headers", s.Name)
		}
		if isPrefix && s.Flag != "" {
			t.Errorf("%s: prefix settings have no flag", s.Name)
		}
		if s.Default != "" && s.Value.set != nil {
			if err := s.Value.set(&Config{}, s.Default); err != nil {
				t.Errorf("%s: default %q does not parse: %v", s.Name, s.Default, err)
			}
		}
		if !strings.HasPrefix(s.Name, "MESHAGENT_") && s.Group != GroupIstio {
			t.Errorf("%s: only Istio-compatible settings may go without the MESHAGENT_ prefix", s.Name)
		}
	}
}

func TestDefaults(t *testing.T) {
	c := resolve(t, nil, nil)
	want := Config{
		CAAddr: DefaultDiscoveryAddress, CAProvider: ProviderIstio, CARoot: "./var/run/secrets/istio/root-cert.pem",
		XDSRoot: "./var/run/secrets/istio/root-cert.pem", PilotCertProvider: "istiod", TrustDomain: "cluster.local",
		JWTPolicy: "third-party-jwt", CredentialFetcherType: "JWT", SecretTTL: 24 * time.Hour, GraceRatio: 0.5,
		GraceJitter: 0.01, FileDebounce: 100 * time.Millisecond, XDSProxy: true, WorkloadAPI: true, Mode: ModeSidecar, SDSMaxStreams: 4096, WorkloadAPIMaxStreams: 4096, SDSMaxStreamsPerPod: 64, BrokerMaxStreams: DefaultBrokerMaxStreams, BrokerMaxWorkloads: DefaultBrokerMaxWorkloads,
		SocketMaxConnsPerCaller: 32, SocketMaxConnRatePerCaller: 20, SocketMaxStreamsPerConn: 100, SocketMaxUnaryPerCaller: 16, SocketMaxQueuedBytesPerCaller: 4 << 20, SocketIdleTimeout: 5 * time.Minute, SDSMaxFileResourcesPerCaller: 16, SDSMaxRecvBytes: 65536, CAMaxConcurrentCSRs: 8, IdentityIdleGrace: time.Minute, WorkloadRSAKeySize: 2048, ECCCurve: "P256",
		GRPCXDSBootstrap: "etc/istio/proxy/grpc-bootstrap.json", DiscoveryAddress: DefaultDiscoveryAddress,
		StatusPort: 15020, TerminationDrainDuration: DefaultTerminationDrainDuration, WorkloadIdentitySocketFile: "socket", KeyType: pki.ECP256, LinkerdNamespace: "linkerd",
		LinkerdIdentityServiceName: "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local",
		SDSSocket:                  "./var/run/secrets/workload-spiffe-uds/socket", XDSSocket: "./etc/istio/proxy/XDS",
		WorkloadCredentialsDir: "./var/run/secrets/workload-spiffe-credentials", FileMountedCertsDir: "./etc/certs", FileResourceDirs: DefaultFileResourceDirs, NodePodTokensDir: "./var/run/meshagent/pod-tokens",
		TokenPath: "./var/run/secrets/tokens/istio-token", LogLevel: "info", InstanceIP: "127.0.0.1",
		CredentialIdentityProvider: "istio-ca", TokenLifetime: time.Hour, TokenRefreshRatio: 0.8,
		CRLFile: "./var/run/secrets/istio/crl/ca-crl.pem", OutputKeyMode: 0o600, OutputCertMode: 0o644,
		ReloadTimeout: 10 * time.Second, ReloadSignal: "SIGHUP", CredentialUDSSocket: "./var/run/secrets/credential-uds/socket", SPIFFEBundleMap: true,
	}
	if want, _ := pki.IstioScheme("cluster.local"); c.Scheme() != want {
		t.Errorf("scheme %v, want %v", c.Scheme(), want)
	}
	c.rows, c.proxyStatusPort, c.proxyDrainSet, c.scheme = nil, 0, false, pki.Scheme{}
	if len(c.CAHeaders) != 0 || len(c.XDSHeaders) != 0 {
		t.Errorf("headers = %v %v, want none", c.CAHeaders, c.XDSHeaders)
	}
	c.CAHeaders, c.XDSHeaders = nil, nil
	if !reflect.DeepEqual(*c, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", *c, want)
	}
	if got := c.StatusAddr(); got != ":15020" {
		t.Errorf("StatusAddr = %q", got)
	}
}

func TestTableHasEverySettingWithSource(t *testing.T) {
	c := resolve(t, []string{"CA_ADDR=ca.example:443", "TRUST_DOMAIN=example.org"}, map[string]string{"trust-domain": "flag.example", "log-level": "debug"})
	rows := c.Table()
	if len(rows) != len(Registry) {
		t.Fatalf("table has %d rows, registry %d", len(rows), len(Registry))
	}
	for i, r := range rows {
		if r.Name != Registry[i].Name || r.Doc != Registry[i].Doc {
			t.Errorf("row %d = %s, want %s", i, r.Name, Registry[i].Name)
		}
	}
	for _, tt := range []struct {
		name, value string
		source      Source
	}{
		{"CA_ADDR", "ca.example:443", SourceEnv},
		{"TRUST_DOMAIN", "flag.example", SourceFlag},
		{"MESHAGENT_LOG_LEVEL", "debug", SourceFlag},
		{"SECRET_TTL", "24h0m0s", SourceDefault},
		{"CA_PROVIDER", "Citadel", SourceDefault},
	} {
		r := row(t, c, tt.name)
		if r.Value != tt.value || r.Source != tt.source {
			t.Errorf("%s = %q (%s), want %q (%s)", tt.name, r.Value, r.Source, tt.value, tt.source)
		}
	}
	if c.TrustDomain != "flag.example" {
		t.Errorf("flag did not override env: %q", c.TrustDomain)
	}
}

func TestEmptyValueIsUnset(t *testing.T) {
	c := resolve(t, []string{"CA_PROVIDER=", "SECRET_TTL="}, map[string]string{"ca-addr": ""})
	if c.CAProvider != ProviderIstio || c.SecretTTL != 24*time.Hour || c.CAAddr != DefaultDiscoveryAddress {
		t.Errorf("empty values were not treated as unset: %+v", c)
	}
	if r := row(t, c, "CA_PROVIDER"); r.Source != SourceDefault {
		t.Errorf("source = %s", r.Source)
	}
}

func TestSDSAllowedUIDs(t *testing.T) {
	c, err := Resolve(Input{Env: []string{"MESHAGENT_SDS_ALLOWED_UIDS= 1337, 0,,4294967294 "}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint32{1337, 0, 4294967294}; !slices.Equal(c.SDSAllowedUIDs, want) {
		t.Fatalf("SDSAllowedUIDs = %v, want %v", c.SDSAllowedUIDs, want)
	}
}

func TestInvalidValues(t *testing.T) {
	tests := []struct {
		name  string
		env   []string
		flags map[string]string
		want  string
	}{
		{"enum", []string{"CA_PROVIDER=Bogus"}, nil, `invalid CA_PROVIDER="Bogus": accepted: Citadel, Linkerd`},
		{"enum from flag", nil, map[string]string{"ca-provider": "Bogus"}, `invalid --ca-provider="Bogus": accepted: Citadel, Linkerd`},
		{"duration", []string{"SECRET_TTL=forever"}, nil, `invalid SECRET_TTL="forever": want a duration such as 100ms, 90s or 24h`},
		{"duration too short", []string{"SECRET_TTL=10ms"}, nil, `invalid SECRET_TTL="10ms": want at least 1s`},
		{"ratio", []string{"SECRET_GRACE_PERIOD_RATIO=1.5"}, nil, `invalid SECRET_GRACE_PERIOD_RATIO="1.5": want a number greater than 0 and at most 1 (0 would renew only after the certificate expired)`},
		{"nan", []string{"SECRET_GRACE_PERIOD_RATIO=NaN"}, nil, `invalid SECRET_GRACE_PERIOD_RATIO="NaN": want a number greater than 0 and at most 1 (0 would renew only after the certificate expired)`},
		{"ratio 0", []string{"SECRET_GRACE_PERIOD_RATIO=0"}, nil, `invalid SECRET_GRACE_PERIOD_RATIO="0": want a number greater than 0 and at most 1 (0 would renew only after the certificate expired)`},
		{"max csrs 0", []string{"MESHAGENT_CA_MAX_CONCURRENT_CSRS=0"}, nil, `invalid MESHAGENT_CA_MAX_CONCURRENT_CSRS="0": want an integer from 1 to 1024`},
		{"bool", []string{"FILE_MOUNTED_CERTS=yes"}, nil, `invalid FILE_MOUNTED_CERTS="yes": accepted: true or false`},
		{"rsa size", []string{"WORKLOAD_RSA_KEY_SIZE=1024"}, nil, `invalid WORKLOAD_RSA_KEY_SIZE="1024": accepted: one of 2048, 3072, 4096`},
		{"key type", []string{"MESHAGENT_KEY_TYPE=ed25519"}, nil, `invalid MESHAGENT_KEY_TYPE="ed25519": accepted: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096`},
		{"port", []string{"STATUS_PORT=70000"}, nil, `invalid STATUS_PORT="70000": want an integer from 0 to 65535`},
		{"host port", []string{"CA_ADDR=istiod"}, nil, `invalid CA_ADDR="istiod": want host:port, e.g. istiod.istio-system.svc:15012`},
		{"socket file", []string{"WORKLOAD_IDENTITY_SOCKET_FILE=a/b"}, nil, `invalid WORKLOAD_IDENTITY_SOCKET_FILE="a/b": want a file name without '/'`},
		{"trust domain", []string{"TRUST_DOMAIN=Example.ORG"}, nil, `invalid TRUST_DOMAIN="Example.ORG": want a trust domain of lower-case letters, digits, '.', '-' and '_'`},
		{"namespace", []string{"POD_NAMESPACE=a/b"}, nil, `invalid POD_NAMESPACE="a/b": want a name of letters, digits, '.', '-' and '_'`},
		{"proxy config", []string{"PROXY_CONFIG={not json"}, nil, `invalid PROXY_CONFIG="{not json": not valid JSON: invalid character 'n' looking for beginning of object key string`},
		{"proxy config not object", []string{"PROXY_CONFIG=[1]"}, nil, `invalid PROXY_CONFIG="[1]": want a JSON object`},
		{"proxy config bad address", []string{`PROXY_CONFIG={"discoveryAddress":"nohost"}`}, nil, `invalid PROXY_CONFIG="{\"discoveryAddress\":\"nohost\"}": discoveryAddress "nohost": want host:port, e.g. istiod.istio-system.svc:15012`},
		{"newline stays on one line", []string{"CA_PROVIDER=a\nb"}, nil, `invalid CA_PROVIDER="a\nb": accepted: Citadel, Linkerd`},
		{"uid list", []string{"MESHAGENT_SDS_ALLOWED_UIDS=1337,envoy"}, nil, `invalid MESHAGENT_SDS_ALLOWED_UIDS="1337,envoy": want comma-separated numeric uids from 0 to 4294967294`},
		{"sds streams", []string{"MESHAGENT_SDS_MAX_STREAMS=0"}, nil, `invalid MESHAGENT_SDS_MAX_STREAMS="0": want an integer from 1 to 1048576`},
		{"sds file resources per caller", []string{"MESHAGENT_SDS_MAX_FILE_RESOURCES_PER_CALLER=0"}, nil, `invalid MESHAGENT_SDS_MAX_FILE_RESOURCES_PER_CALLER="0": want an integer from 1 to 1048576`},
		{"header name", []string{"CA_HEADER_a b=1"}, nil, `invalid CA_HEADER_a b="1": a header name may hold only letters, digits, '-', '_' and '.'`},
		{"header empty name", []string{"XDS_HEADER_=1"}, nil, `invalid XDS_HEADER_="1": the header name after the prefix is empty`},
		{"fetcher type", []string{"CREDENTIAL_FETCHER_TYPE=GoogleComputeEngine"}, nil, `invalid CREDENTIAL_FETCHER_TYPE="GoogleComputeEngine": accepted: JWT, TokenRequest`},
		{"token lifetime below the API minimum", []string{"MESHAGENT_TOKEN_LIFETIME=5m"}, nil, `invalid MESHAGENT_TOKEN_LIFETIME="5m": want at least 10m0s`},
		{"file debounce 0", []string{"FILE_DEBOUNCE_DURATION=0"}, nil, `invalid FILE_DEBOUNCE_DURATION="0": want at least 1ms`},
		{"identity idle grace below a second", []string{"MESHAGENT_IDENTITY_IDLE_GRACE=500ms"}, nil, `invalid MESHAGENT_IDENTITY_IDLE_GRACE="500ms": want at least 1s`},
		{"token refresh ratio", []string{"MESHAGENT_TOKEN_REFRESH_RATIO=0"}, nil, `invalid MESHAGENT_TOKEN_REFRESH_RATIO="0": want a number from 0.001 to 1`},
		{"header value hidden", []string{"CA_HEADER_X=secret\x01"}, nil, `invalid CA_HEADER_X="<redacted>": a header value may hold only printable ASCII (no line breaks)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Resolve(Input{Env: tt.env, Flags: tt.flags})
			if err == nil {
				t.Fatalf("no error; config %+v", c)
			}
			if c != nil {
				t.Error("a config was returned with the error")
			}
			var inv *InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("error %T is not *InvalidError", err)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("error:\n got %s\nwant %s", got, tt.want)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

// TestTerminationDrainDuration: PROXY_CONFIG's terminationDrainDuration, a
// proto JSON duration under either name, is the drain; Istio's 5s without
// it; a value that is not one is refused with the field named.
func TestTerminationDrainDuration(t *testing.T) {
	for _, tt := range []struct {
		proxyConfig string
		want        time.Duration
	}{
		{`{}`, 5 * time.Second},
		{`{"terminationDrainDuration":"30s"}`, 30 * time.Second},
		{`{"termination_drain_duration":"0.25s"}`, 250 * time.Millisecond},
		{`{"terminationDrainDuration":"0s"}`, 0},
		{`{"terminationDrainDuration":"1.000000001s"}`, time.Second + 1},
		{`{"terminationDrainDuration":"600s","discoveryAddress":"cp:1"}`, 10 * time.Minute},
	} {
		c := resolve(t, []string{"PROXY_CONFIG=" + tt.proxyConfig}, nil)
		if c.TerminationDrainDuration != tt.want {
			t.Errorf("%s: drain %v, want %v", tt.proxyConfig, c.TerminationDrainDuration, tt.want)
		}
		// What `meshagent config` shows reads back as the same drain.
		again := resolve(t, []string{"PROXY_CONFIG=" + row(t, c, "PROXY_CONFIG").Value}, nil)
		if again.TerminationDrainDuration != tt.want {
			t.Errorf("%s: shown as %s, read back as %v", tt.proxyConfig, row(t, c, "PROXY_CONFIG").Value, again.TerminationDrainDuration)
		}
	}
	for _, bad := range []string{`"5"`, `"-1s"`, `"1m"`, `"5 s"`, `"1.0000000001s"`, `5`, `"99999999999999999999s"`, `"9223372037s"`} {
		raw := `{"terminationDrainDuration":` + bad + `}`
		_, err := Resolve(Input{Env: []string{"PROXY_CONFIG=" + raw}, FileExists: func(string) bool { return false }})
		if err == nil || !strings.Contains(err.Error(), "PROXY_CONFIG") {
			t.Errorf("%s: err %v, want an error naming PROXY_CONFIG", raw, err)
		}
	}
}

func TestProxyConfig(t *testing.T) {
	tests := []struct {
		name       string
		env        []string
		flags      map[string]string
		caAddr     string
		port       int
		portSource Source
		discovery  string
	}{
		{"defaults", nil, nil, DefaultDiscoveryAddress, 15020, SourceDefault, DefaultDiscoveryAddress},
		{"discovery address feeds CA_ADDR", []string{`PROXY_CONFIG={"discoveryAddress":"cp.example:15012","concurrency":2}`}, nil, "cp.example:15012", 15020, SourceDefault, "cp.example:15012"},
		{"snake case names", []string{`PROXY_CONFIG={"discovery_address":"cp.example:1","status_port":"16000"}`}, nil, "cp.example:1", 16000, SourceEnv, "cp.example:1"},
		{"statusPort", []string{`PROXY_CONFIG={"statusPort":15999}`}, nil, DefaultDiscoveryAddress, 15999, SourceEnv, DefaultDiscoveryAddress},
		{"STATUS_PORT wins", []string{`PROXY_CONFIG={"statusPort":15999}`, "STATUS_PORT=15021"}, nil, DefaultDiscoveryAddress, 15021, SourceEnv, DefaultDiscoveryAddress},
		{"flag wins", []string{"STATUS_PORT=15021"}, map[string]string{"status-port": "0"}, DefaultDiscoveryAddress, 0, SourceFlag, DefaultDiscoveryAddress},
		{"CA_ADDR set", []string{`PROXY_CONFIG={"discoveryAddress":"cp.example:15012"}`, "CA_ADDR=ca.example:443"}, nil, "ca.example:443", 15020, SourceDefault, "cp.example:15012"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := resolve(t, tt.env, tt.flags)
			if c.TerminationDrainDuration != DefaultTerminationDrainDuration {
				t.Errorf("terminationDrainDuration %v, want the default %v", c.TerminationDrainDuration, DefaultTerminationDrainDuration)
			}
			if c.CAAddr != tt.caAddr || c.StatusPort != tt.port || c.DiscoveryAddress != tt.discovery {
				t.Errorf("CA_ADDR %q port %d discovery %q, want %q %d %q", c.CAAddr, c.StatusPort, c.DiscoveryAddress, tt.caAddr, tt.port, tt.discovery)
			}
			if r := row(t, c, "STATUS_PORT"); r.Source != tt.portSource {
				t.Errorf("STATUS_PORT source %s, want %s", r.Source, tt.portSource)
			}
		})
	}
}

func TestLinkerdDefaults(t *testing.T) {
	c := resolve(t, []string{"CA_PROVIDER=linkerd", "POD_NAMESPACE=shop", "SERVICE_ACCOUNT=web", "TRUST_DOMAIN=example.org"}, nil)
	if c.CAProvider != ProviderLinkerd {
		t.Errorf("provider %q not canonicalised", c.CAProvider)
	}
	if c.GraceRatio != 0.3 {
		t.Errorf("grace ratio %v, want 0.3", c.GraceRatio)
	}
	if c.CAAddr != "linkerd-identity.linkerd.svc.example.org:8080" {
		t.Errorf("CA_ADDR %q", c.CAAddr)
	}
	if c.LinkerdIdentityServiceName != "linkerd-identity.linkerd.serviceaccount.identity.linkerd.example.org" {
		t.Errorf("service name %q", c.LinkerdIdentityServiceName)
	}
	id, err := c.Identity()
	if err != nil || id.DNSName != "web.shop.serviceaccount.identity.linkerd.example.org" {
		t.Errorf("identity %v, %v", id, err)
	}
	if r := row(t, c, "SECRET_GRACE_PERIOD_RATIO"); r.Source != SourceDefault || r.Note == "" || r.Value != "0.3" {
		t.Errorf("grace ratio row %+v", r)
	}

	c = resolve(t, []string{"CA_PROVIDER=Linkerd", "SECRET_GRACE_PERIOD_RATIO=0.5", "MESHAGENT_LINKERD_NAMESPACE=l5d"}, nil)
	if c.GraceRatio != 0.5 {
		t.Errorf("explicit ratio overridden: %v", c.GraceRatio)
	}
	if c.LinkerdIdentityServiceName != "linkerd-identity.l5d.serviceaccount.identity.l5d.cluster.local" {
		t.Errorf("service name %q", c.LinkerdIdentityServiceName)
	}
}

func TestTokenSettings(t *testing.T) {
	tests := []struct {
		name     string
		env      []string
		fetcher  string
		audience string
	}{
		{"defaults", nil, FetcherJWT, "istio-ca"},
		{"token request, any case", []string{"CREDENTIAL_FETCHER_TYPE=tokenrequest"}, FetcherTokenRequest, "istio-ca"},
		{"jwt, any case", []string{"CREDENTIAL_FETCHER_TYPE=jwt"}, FetcherJWT, "istio-ca"},
		{"linkerd audience", []string{"CA_PROVIDER=Linkerd", "CREDENTIAL_FETCHER_TYPE=TokenRequest"}, FetcherTokenRequest, "identity.l5d.io"},
		{"audience set", []string{"CA_PROVIDER=Linkerd", "CREDENTIAL_IDENTITY_PROVIDER=my-ca"}, FetcherJWT, "my-ca"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := resolve(t, tt.env, nil)
			if c.CredentialFetcherType != tt.fetcher || c.CredentialIdentityProvider != tt.audience {
				t.Errorf("fetcher %q audience %q, want %q %q", c.CredentialFetcherType, c.CredentialIdentityProvider, tt.fetcher, tt.audience)
			}
		})
	}
	c := resolve(t, []string{"MESHAGENT_TOKEN_LIFETIME=10m", "POD_UID=1234-abcd", "KUBECONFIG=/a:/b"}, nil)
	if c.TokenLifetime != 10*time.Minute || c.PodUID != "1234-abcd" || c.Kubeconfig != "/a:/b" {
		t.Errorf("lifetime %s pod uid %q kubeconfig %q", c.TokenLifetime, c.PodUID, c.Kubeconfig)
	}
}

func TestKeyType(t *testing.T) {
	tests := []struct {
		name   string
		env    []string
		want   pki.KeyType
		source Source
	}{
		{"default", nil, pki.ECP256, SourceDefault},
		{"explicit", []string{"MESHAGENT_KEY_TYPE=rsa-3072"}, pki.RSA3072, SourceEnv},
		{"ecdsa", []string{"ECC_SIGNATURE_ALGORITHM=ECDSA"}, pki.ECP256, SourceEnv},
		{"ecdsa p384", []string{"ECC_SIGNATURE_ALGORITHM=ECDSA", "ECC_CURVE=P384"}, pki.ECP384, SourceEnv},
		{"ecdsa wins over rsa size", []string{"ECC_SIGNATURE_ALGORITHM=ECDSA", "WORKLOAD_RSA_KEY_SIZE=4096"}, pki.ECP256, SourceEnv},
		{"rsa size", []string{"WORKLOAD_RSA_KEY_SIZE=4096"}, pki.RSA4096, SourceEnv},
		{"rsa algorithm", []string{"ECC_SIGNATURE_ALGORITHM=RSA"}, pki.RSA2048, SourceEnv},
		{"explicit wins", []string{"MESHAGENT_KEY_TYPE=ec-p384", "WORKLOAD_RSA_KEY_SIZE=4096"}, pki.ECP384, SourceEnv},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := resolve(t, tt.env, nil)
			if c.KeyType != tt.want {
				t.Errorf("key type %s, want %s", c.KeyType, tt.want)
			}
			if !slices.Contains(pki.KeyTypes, c.KeyType) {
				t.Errorf("key type %s is not one of pki.KeyTypes", c.KeyType)
			}
			if r := row(t, c, "MESHAGENT_KEY_TYPE"); r.Source != tt.source {
				t.Errorf("source %s, want %s", r.Source, tt.source)
			}
		})
	}
}

func TestHeaders(t *testing.T) {
	c := resolve(t, []string{"CA_HEADER_x-api-key=s3cret", "XDS_HEADER_Tenant=blue", "CA_HEADER_x-api-key=second", "CA_HEADERX=ignored"}, nil)
	if len(c.CAHeaders) != 1 || c.CAHeaders["x-api-key"] != "s3cret" {
		t.Errorf("CA headers %v", c.CAHeaders)
	}
	if len(c.XDSHeaders) != 1 || c.XDSHeaders["Tenant"] != "blue" {
		t.Errorf("XDS headers %v", c.XDSHeaders)
	}
	r := row(t, c, "CA_HEADER_<NAME>")
	if r.Source != SourceEnv || r.Value != "x-api-key=<redacted>" || strings.Contains(r.Value, "s3cret") {
		t.Errorf("row %+v", r)
	}
	if r := row(t, resolve(t, nil, nil), "XDS_HEADER_<NAME>"); r.Source != SourceDefault || r.Value != "" {
		t.Errorf("row %+v", r)
	}
}

func TestDerivedPaths(t *testing.T) {
	c := resolve(t, []string{"WORKLOAD_IDENTITY_SOCKET_FILE=sds.sock", "JWT_POLICY=first-party-jwt", "PROV_CERT=/etc/prov"}, nil)
	if c.SDSSocket != "./var/run/secrets/workload-spiffe-uds/sds.sock" {
		t.Errorf("SDS socket %q", c.SDSSocket)
	}
	if c.TokenPath != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
		t.Errorf("token path %q", c.TokenPath)
	}
	if c.CARoot != "/etc/prov/root-cert.pem" || c.XDSRoot != c.CARoot {
		t.Errorf("roots %q %q", c.CARoot, c.XDSRoot)
	}

	c = resolve(t, nil, map[string]string{"sds-socket": "/tmp/x/sds", "token-path": "tok", "ca-root": "SYSTEM"})
	if c.SDSSocket != "/tmp/x/sds" || c.TokenPath != "tok" || c.CARoot != SystemRoots {
		t.Errorf("flags ignored: %q %q %q", c.SDSSocket, c.TokenPath, c.CARoot)
	}

	mounted, err := Resolve(Input{
		Env:        []string{"MESHAGENT_FILE_MOUNTED_CERTS_DIR=/certs"},
		FileExists: func(p string) bool { return p == "/certs/root-cert.pem" },
	})
	if err != nil {
		t.Fatal(err)
	}
	if mounted.XDSRoot != "/certs/root-cert.pem" {
		t.Errorf("xDS root %q, want the file-mounted root", mounted.XDSRoot)
	}
}

func TestXDSRootFromWorkingDirectory(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	c, err := Resolve(Input{Env: []string{"MESHAGENT_FILE_MOUNTED_CERTS_DIR=certs"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.XDSRoot != c.CARoot {
		t.Errorf("xDS root %q without a mounted root", c.XDSRoot)
	}
	writeFile(t, dir+"/certs/root-cert.pem", "x")
	c, err = Resolve(Input{Env: []string{"MESHAGENT_FILE_MOUNTED_CERTS_DIR=certs"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.XDSRoot != "certs/root-cert.pem" {
		t.Errorf("xDS root %q", c.XDSRoot)
	}
}

func TestIdentity(t *testing.T) {
	c := resolve(t, []string{"POD_NAMESPACE=shop", "SERVICE_ACCOUNT=web", "TRUST_DOMAIN=example.org"}, nil)
	id, err := c.Identity()
	if err != nil || id.SPIFFEID != "spiffe://example.org/ns/shop/sa/web" {
		t.Errorf("identity %v, %v", id, err)
	}
	if _, err := resolve(t, []string{"SERVICE_ACCOUNT=web"}, nil).Identity(); err == nil || !strings.Contains(err.Error(), "POD_NAMESPACE") {
		t.Errorf("missing namespace: %v", err)
	}
	if _, err := resolve(t, []string{"POD_NAMESPACE=shop"}, nil).Identity(); err == nil || !strings.Contains(err.Error(), "SERVICE_ACCOUNT") {
		t.Errorf("missing service account: %v", err)
	}
	dev := resolve(t, nil, map[string]string{"dev": "true"})
	id, err = dev.Identity()
	if err != nil || id.SPIFFEID != "spiffe://cluster.local/ns/default/sa/default" {
		t.Errorf("dev identity %v, %v", id, err)
	}
}

func TestInstanceIP(t *testing.T) {
	addrs := func(list ...string) func() ([]net.Addr, error) {
		return func() ([]net.Addr, error) {
			var out []net.Addr
			for _, s := range list {
				ip, n, err := net.ParseCIDR(s)
				if err != nil {
					t.Fatal(err)
				}
				n.IP = ip
				out = append(out, n)
			}
			return out, nil
		}
	}
	tests := []struct {
		name  string
		env   []string
		addrs func() ([]net.Addr, error)
		want  string
	}{
		{"set", []string{"INSTANCE_IP=10.1.2.3"}, addrs("192.168.0.9/24"), "10.1.2.3"},
		{"set v6 canonical", []string{"INSTANCE_IP=FD00:0::1"}, nil, "fd00::1"},
		{"first usable v4", nil, addrs("127.0.0.1/8", "fe80::1/64", "2001:db8::5/64", "10.0.0.7/24", "10.0.0.8/24"), "10.0.0.7"},
		{"v6 when no v4", nil, addrs("127.0.0.1/8", "::1/128", "fe80::1/64", "2001:db8::5/64"), "2001:db8::5"},
		{"loopback only", nil, addrs("127.0.0.1/8", "::1/128"), "127.0.0.1"},
		{"no interfaces", nil, func() ([]net.Addr, error) { return nil, errors.New("no") }, "127.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Resolve(Input{Env: tt.env, FileExists: func(string) bool { return false }, InterfaceAddrs: tt.addrs})
			if err != nil {
				t.Fatal(err)
			}
			if c.InstanceIP != tt.want {
				t.Errorf("InstanceIP = %q, want %q", c.InstanceIP, tt.want)
			}
		})
	}
	_, err := Resolve(Input{Env: []string{"INSTANCE_IP=10.1.2"}})
	var ie *InvalidError
	if !errors.As(err, &ie) || ie.Name != "INSTANCE_IP" {
		t.Fatalf("INSTANCE_IP=10.1.2: %v, want an InvalidError naming INSTANCE_IP", err)
	}
}

func TestPilotCertProviderChoosesTheCARoot(t *testing.T) {
	tests := []struct {
		name     string
		env      []string
		wantCA   string
		wantNote string
	}{
		{"istiod", nil, "./var/run/secrets/istio/root-cert.pem", ""},
		{"custom", []string{"PILOT_CERT_PROVIDER=custom"}, "etc/certs/root-cert.pem", "PILOT_CERT_PROVIDER=custom"},
		{"custom before PROV_CERT", []string{"PILOT_CERT_PROVIDER=custom", "PROV_CERT=/prov", "MESHAGENT_FILE_MOUNTED_CERTS_DIR=/mounted"}, "/mounted/root-cert.pem", "PILOT_CERT_PROVIDER=custom"},
		{"CA_ROOT_CA wins", []string{"PILOT_CERT_PROVIDER=custom", "CA_ROOT_CA=/ca.pem"}, "/ca.pem", ""},
		{"none with PROV_CERT", []string{"PILOT_CERT_PROVIDER=none", "PROV_CERT=/prov"}, "/prov/root-cert.pem", "from PROV_CERT"},
		{"none with CA_ROOT_CA", []string{"PILOT_CERT_PROVIDER=none", "CA_ROOT_CA=SYSTEM"}, "SYSTEM", ""},
		{"kubernetes as istiod", []string{"PILOT_CERT_PROVIDER=kubernetes"}, "./var/run/secrets/istio/root-cert.pem", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := resolve(t, tt.env, nil)
			if c.CARoot != tt.wantCA {
				t.Errorf("CARoot = %q, want %q", c.CARoot, tt.wantCA)
			}
			if n := row(t, c, "CA_ROOT_CA").Note; n != tt.wantNote {
				t.Errorf("CA_ROOT_CA note = %q, want %q", n, tt.wantNote)
			}
		})
	}
}

func TestPilotCertProviderNoneNeedsARoot(t *testing.T) {
	for _, env := range [][]string{
		{"PILOT_CERT_PROVIDER=none"},
		{"PILOT_CERT_PROVIDER=none", "FILE_MOUNTED_CERTS=true"}, // the xDS proxy still needs one
	} {
		_, err := Resolve(Input{Env: env, FileExists: func(string) bool { return false }})
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Name != "PILOT_CERT_PROVIDER" || ie.Value != "none" || !strings.Contains(ie.Why, "_ROOT_CA") {
			t.Errorf("%v: %v, want an InvalidError naming PILOT_CERT_PROVIDER and the root to set", env, err)
		}
	}
	// No CA and no xDS proxy: nothing to verify, nothing to refuse.
	if _, err := Resolve(Input{Env: []string{"PILOT_CERT_PROVIDER=none", "FILE_MOUNTED_CERTS=true", "MESHAGENT_XDS_PROXY=false"}}); err != nil {
		t.Errorf("file-mounted certificates without the xDS proxy: %v", err)
	}
	// The file-mounted root serves the xDS proxy.
	c, err := Resolve(Input{Env: []string{"PILOT_CERT_PROVIDER=none", "FILE_MOUNTED_CERTS=true"}, FileExists: func(string) bool { return true }})
	if err != nil || c.XDSRoot != "etc/certs/root-cert.pem" {
		t.Errorf("file-mounted root for xDS: %v, %q", err, c.XDSRoot)
	}
}

func TestWarningsNameSettingsWithoutEffect(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want []string
	}{
		{"defaults", nil, nil},
		{"fetcher set", []string{"CREDENTIAL_FETCHER_TYPE=JWT"}, nil},
		{"audience without TokenRequest", []string{"CREDENTIAL_IDENTITY_PROVIDER=https://issuer"}, []string{"CREDENTIAL_IDENTITY_PROVIDER"}},
		{"token settings without TokenRequest", []string{"MESHAGENT_TOKEN_LIFETIME=2h", "MESHAGENT_TOKEN_REFRESH_RATIO=0.5"},
			[]string{"MESHAGENT_TOKEN_LIFETIME", "MESHAGENT_TOKEN_REFRESH_RATIO"}},
		{"pod facts are never warned about", []string{"POD_UID=u", "KUBECONFIG=/k"}, nil},
		{"token settings with TokenRequest", []string{"CREDENTIAL_FETCHER_TYPE=TokenRequest", "CREDENTIAL_IDENTITY_PROVIDER=my-ca", "POD_UID=u", "KUBECONFIG=/k", "MESHAGENT_TOKEN_LIFETIME=2h", "MESHAGENT_TOKEN_REFRESH_RATIO=0.5"}, nil},
		{"kubernetes", []string{"PILOT_CERT_PROVIDER=kubernetes"}, []string{"PILOT_CERT_PROVIDER"}},
		{"custom is honoured", []string{"PILOT_CERT_PROVIDER=custom"}, nil},
		{"istiod set", []string{"PILOT_CERT_PROVIDER=istiod"}, nil},
		{"drain in a sidecar", []string{`PROXY_CONFIG={"terminationDrainDuration":"30s"}`}, nil},
		{"drain in node mode", []string{`PROXY_CONFIG={"terminationDrainDuration":"30s"}`, "MESHAGENT_MODE=node", "NODE_NAME=n"}, []string{"PROXY_CONFIG"}},
		{"zero drain in node mode", []string{`PROXY_CONFIG={"terminationDrainDuration":"0s"}`, "MESHAGENT_MODE=node", "NODE_NAME=n"}, nil},
		{"drain without Envoy", []string{`PROXY_CONFIG={"terminationDrainDuration":"30s"}`, "DISABLE_ENVOY=true"}, []string{"PROXY_CONFIG"}},
		{"node mode without drain", []string{`PROXY_CONFIG={"statusPort":15020}`, "MESHAGENT_MODE=node", "NODE_NAME=n"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, w := range resolve(t, tt.env, nil).Warnings() {
				got = append(got, w.Name)
				if w.Why == "" || !strings.Contains(w.String(), w.Name+"=") {
					t.Errorf("warning %q does not say what and why", w)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("warnings for %v: %v, want %v", tt.env, got, tt.want)
			}
		})
	}
}

// TestSDSMaxStreamsScalesInNodeMode: one node's pods share the SDS bound in
// node mode, so it is larger there; a value set is kept in either mode.
func TestSDSMaxStreamsScalesInNodeMode(t *testing.T) {
	for _, tt := range []struct {
		env  []string
		want int
	}{
		{nil, 4096},
		{[]string{"MESHAGENT_MODE=node", "NODE_NAME=n1"}, 65536},
		{[]string{"MESHAGENT_MODE=node", "NODE_NAME=n1", "MESHAGENT_SDS_MAX_STREAMS=100"}, 100},
		{[]string{"MESHAGENT_SDS_MAX_STREAMS=100"}, 100},
	} {
		c := resolve(t, tt.env, nil)
		if c.SDSMaxStreams != tt.want {
			t.Errorf("%v: SDSMaxStreams = %d, want %d", tt.env, c.SDSMaxStreams, tt.want)
		}
		if c.SDSMaxStreamsPerPod != 64 {
			t.Errorf("%v: SDSMaxStreamsPerPod = %d, want 64", tt.env, c.SDSMaxStreamsPerPod)
		}
	}
}

// TestInvalidCombinations: settings that cannot work together are refused by
// Resolve, each with one line naming a setting and the fix.
func TestInvalidCombinations(t *testing.T) {
	const broker = "MESHAGENT_BROKERS=spiffe://cluster.local/ns/a/sa/b=pod"
	tests := []struct {
		name  string
		env   []string
		flags map[string]string
		want  string
	}{
		{"node mode without a node name", []string{"MESHAGENT_MODE=node"}, nil, `invalid MESHAGENT_MODE="node": needs NODE_NAME: only the pods of this node are served`},
		{"node mode from the flag without a node name", nil, map[string]string{"mode": "node"}, `invalid --mode="node": needs NODE_NAME: only the pods of this node are served`},
		{"node mode without the socket", []string{"MESHAGENT_MODE=node", "NODE_NAME=n1", "DISABLE_ENVOY=true"}, nil,
			`invalid MESHAGENT_MODE="node": needs the SDS socket to serve the pods' certificates (DISABLE_ENVOY is set): unset DISABLE_ENVOY`},
		{"node uid identities", []string{"MESHAGENT_MODE=node", "NODE_NAME=n1", "MESHAGENT_NODE_UID_IDENTITIES=0=https://x"}, nil,
			`invalid MESHAGENT_NODE_UID_IDENTITIES="0=https://x": node uid identity "0=https://x": scheme is missing or invalid`},
		{"broker socket outside node mode", []string{"MESHAGENT_BROKER_SOCKET=/tmp/b/socket", broker}, nil,
			`invalid MESHAGENT_BROKER_SOCKET="/tmp/b/socket": served in node mode only (MESHAGENT_MODE=node): unset it`},
		{"broker socket beside the SDS socket", []string{"MESHAGENT_MODE=node", "NODE_NAME=n1", "MESHAGENT_SDS_SOCKET=/tmp/s/socket", "MESHAGENT_BROKER_SOCKET=/tmp/s/broker", broker}, nil,
			`invalid MESHAGENT_BROKER_SOCKET="/tmp/s/broker": in the SDS socket's directory, which every pod mounts: give it a directory of its own, mounted only into the brokers' pods`},
		{"broker socket without brokers", []string{"MESHAGENT_MODE=node", "NODE_NAME=n1", "MESHAGENT_BROKER_SOCKET=/tmp/b/socket"}, nil,
			`invalid MESHAGENT_BROKER_SOCKET="/tmp/b/socket": MESHAGENT_BROKERS lists no broker: list the brokers' SPIFFE IDs, or unset MESHAGENT_BROKER_SOCKET`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Resolve(Input{Env: tt.env, Flags: tt.flags})
			if err == nil {
				t.Fatalf("no error; config %+v", c)
			}
			var inv *InvalidError
			if !errors.As(err, &inv) || c != nil {
				t.Fatalf("Resolve = %v, %v; want only an *InvalidError", c, err)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("error:\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestNodeSettings: a node agent's settings that work together resolve, the
// node processes' identities parsed and shown by uid.
func TestNodeSettings(t *testing.T) {
	c, err := Resolve(Input{Env: []string{"MESHAGENT_MODE=node", "NODE_NAME=n1",
		"MESHAGENT_NODE_UID_IDENTITIES=65534=spiffe://example.org/nobody, 0=spiffe://cluster.local/ns/kube-system/sa/probe",
		"MESHAGENT_SDS_SOCKET=/run/sds/socket", "MESHAGENT_BROKER_SOCKET=/run/broker/socket", "MESHAGENT_BROKERS=spiffe://cluster.local/ns/a/sa/b=pod"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.NodeUIDIdentities) != 2 || c.NodeUIDIdentities[0].String() != "spiffe://cluster.local/ns/kube-system/sa/probe" {
		t.Errorf("NodeUIDIdentities = %v", c.NodeUIDIdentities)
	}
	for _, r := range c.Table() {
		if r.Name == "MESHAGENT_NODE_UID_IDENTITIES" && r.Value != "0=spiffe://cluster.local/ns/kube-system/sa/probe,65534=spiffe://example.org/nobody" {
			t.Errorf("shown as %q", r.Value)
		}
	}
}

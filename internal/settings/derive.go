package settings

import (
	"net"
	"path/filepath"
	"strconv"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/pki"
)

// Default paths, relative to the working directory as in pilot-agent, that
// other defaults are built from.
const (
	sdsSocketDir        = "./var/run/secrets/workload-spiffe-uds"
	thirdPartyTokenPath = "./var/run/secrets/tokens/istio-token"
	firstPartyTokenPath = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	istioRootPath       = "./var/run/secrets/istio/" + files.RootCertFile
	linkerdIdentityPort = "8080"
	devName             = "default"
)

// ProxylessOutputCerts is OUTPUT_CERTS' default when a gRPC bootstrap is
// written: the directory Istio's proxyless injection template
// (grpc-agent) sets, shared with the application's container.
const ProxylessOutputCerts = "/var/lib/istio/data"

// derive fills the defaults that depend on other settings. Each rule applies
// only when the user did not set the setting itself; a note in the table says
// where the value came from.
func (r *resolution) derive(in Input) error {
	c := r.c

	// The identity scheme of CA_PROVIDER: the naming, renewal policy, token
	// audience and CA name that the defaults below follow.
	var err error
	if c.CAProvider == ProviderLinkerd {
		c.scheme, err = pki.LinkerdScheme(c.TrustDomain, c.LinkerdNamespace)
	} else {
		c.scheme, err = pki.IstioScheme(c.TrustDomain)
	}
	if err != nil {
		return r.invalid("TRUST_DOMAIN", c.TrustDomain, err.Error())
	}

	r.deriveServing()
	r.deriveCA()
	r.deriveOutputCerts()
	r.derivePaths(in)

	// INSTANCE_IP: the host's address, as pilot-agent falls back to.
	if c.InstanceIP == "" {
		c.InstanceIP = hostIP(in.InterfaceAddrs)
		r.notes["INSTANCE_IP"] = "the host's address"
	}
	return nil
}

// deriveServing fills the defaults of what the agent serves: the status
// port, dev mode's names, the xDS proxy and the stream bounds.
func (r *resolution) deriveServing() {
	c := r.c
	// STATUS_PORT: PROXY_CONFIG statusPort, else 15020.
	if !r.isSet("STATUS_PORT") {
		c.StatusPort = DefaultStatusPort
		if c.proxyStatusPort != 0 {
			c.StatusPort = c.proxyStatusPort
			r.from("STATUS_PORT", r.sources["PROXY_CONFIG"], "from PROXY_CONFIG statusPort")
		}
	}

	// Dev mode names a workload when nothing else does.
	if c.Dev {
		if c.PodNamespace == "" {
			c.PodNamespace = devName
			r.notes["POD_NAMESPACE"] = "dev mode default"
		}
		if c.ServiceAccount == "" {
			c.ServiceAccount = devName
			r.notes["SERVICE_ACCOUNT"] = "dev mode default"
		}
	}

	// MESHAGENT_XDS_PROXY: on, except in dev mode (there is no control plane).
	if !r.isSet("MESHAGENT_XDS_PROXY") {
		c.XDSProxy = !c.Dev
		if c.Dev {
			r.notes["MESHAGENT_XDS_PROXY"] = "off in dev mode"
		}
	}

	// MESHAGENT_SDS_MAX_STREAMS: one node's pods share the bound in node
	// mode, each within MESHAGENT_SDS_MAX_STREAMS_PER_POD.
	if !r.isSet("MESHAGENT_SDS_MAX_STREAMS") {
		c.SDSMaxStreams = DefaultMaxStreams
		if c.Mode == ModeNode {
			c.SDSMaxStreams = NodeMaxStreams
			r.notes["MESHAGENT_SDS_MAX_STREAMS"] = "node mode default"
		}
	}

	// MESHAGENT_WORKLOAD_API_MAX_STREAMS: in line with SDS.
	if !r.isSet("MESHAGENT_WORKLOAD_API_MAX_STREAMS") {
		c.WorkloadAPIMaxStreams = DefaultMaxStreams
		if c.Mode == ModeNode {
			c.WorkloadAPIMaxStreams = NodeMaxStreams
			r.notes["MESHAGENT_WORKLOAD_API_MAX_STREAMS"] = "node mode default"
		}
	}
}

// deriveCA fills the defaults that follow the CA and its identity scheme:
// the CA's address, the renewal ratio, the token audience and the key type.
func (r *resolution) deriveCA() {
	c := r.c
	// CA_ADDR: the discovery address; Linkerd's identity service for Linkerd.
	if !r.isSet("CA_ADDR") {
		if c.CAProvider == ProviderLinkerd {
			c.CAAddr = "linkerd-identity." + c.LinkerdNamespace + ".svc." + c.TrustDomain + ":" + linkerdIdentityPort
			r.notes["CA_ADDR"] = "Linkerd identity service of MESHAGENT_LINKERD_NAMESPACE"
		} else {
			c.CAAddr = c.DiscoveryAddress
			r.notes["CA_ADDR"] = "from PROXY_CONFIG discoveryAddress"
		}
	}

	// SECRET_GRACE_PERIOD_RATIO: the scheme's (0.3 for Linkerd: refresh at 70 %).
	if !r.isSet("SECRET_GRACE_PERIOD_RATIO") && c.scheme.IsLinkerd() {
		c.GraceRatio = c.scheme.Renewal().GraceRatio
		r.notes["SECRET_GRACE_PERIOD_RATIO"] = "Linkerd default"
	}

	// CREDENTIAL_IDENTITY_PROVIDER: the audience the CA checks.
	if !r.isSet("CREDENTIAL_IDENTITY_PROVIDER") {
		c.CredentialIdentityProvider = c.scheme.TokenAudience()
		if c.scheme.IsLinkerd() {
			r.notes["CREDENTIAL_IDENTITY_PROVIDER"] = "Linkerd identity audience"
		}
	}

	// MESHAGENT_KEY_TYPE: pilot-agent's variables, when set, choose the key.
	if !r.isSet("MESHAGENT_KEY_TYPE") {
		switch {
		case c.ECCSignatureAlgorithm == "ECDSA":
			c.KeyType = pki.ECP256
			if c.ECCCurve == "P384" {
				c.KeyType = pki.ECP384
			}
			r.from("MESHAGENT_KEY_TYPE", r.sources["ECC_SIGNATURE_ALGORITHM"], "from ECC_SIGNATURE_ALGORITHM=ECDSA and ECC_CURVE="+c.ECCCurve)
		case c.ECCSignatureAlgorithm == "RSA" || r.isSet("WORKLOAD_RSA_KEY_SIZE"):
			c.KeyType = pki.KeyType("rsa-" + strconv.Itoa(c.WorkloadRSAKeySize))
			src := r.sources["WORKLOAD_RSA_KEY_SIZE"]
			if !r.isSet("WORKLOAD_RSA_KEY_SIZE") {
				src = r.sources["ECC_SIGNATURE_ALGORITHM"]
			}
			r.from("MESHAGENT_KEY_TYPE", src, "from WORKLOAD_RSA_KEY_SIZE="+strconv.Itoa(c.WorkloadRSAKeySize))
		}
	}

	// MESHAGENT_LINKERD_IDENTITY_SERVICE_NAME.
	if c.LinkerdIdentityServiceName == "" {
		if s, err := pki.LinkerdScheme(c.TrustDomain, c.LinkerdNamespace); err == nil {
			c.LinkerdIdentityServiceName = s.CAServerName()
		}
	}
}

// deriveOutputCerts fills OUTPUT_CERTS: where Istio's proxyless template
// puts the files, whenever a gRPC bootstrap is written, so that its
// certificate provider names files that exist (node mode writes neither).
func (r *resolution) deriveOutputCerts() {
	c := r.c
	if !r.isSet("OUTPUT_CERTS") && c.Mode != ModeNode && (c.DisableEnvoy || r.isSet("GRPC_XDS_BOOTSTRAP")) {
		c.OutputCerts = ProxylessOutputCerts
		if c.DisableEnvoy {
			r.notes["OUTPUT_CERTS"] = "DISABLE_ENVOY=true: the gRPC bootstrap's files (Istio's proxyless default)"
		} else {
			r.notes["OUTPUT_CERTS"] = "GRPC_XDS_BOOTSTRAP is set: the bootstrap's files (Istio's proxyless default)"
		}
	}
}

// derivePaths fills the default paths: the sockets, the token and the
// roots, in pilot-agent's order.
func (r *resolution) derivePaths(in Input) {
	c := r.c
	// Paths.
	if c.SDSSocket == "" {
		c.SDSSocket = sdsSocketDir + "/" + c.WorkloadIdentitySocketFile
	}
	if c.TokenPath == "" {
		c.TokenPath = thirdPartyTokenPath
		if c.JWTPolicy == "first-party-jwt" {
			c.TokenPath = firstPartyTokenPath
			r.notes["MESHAGENT_TOKEN_PATH"] = "JWT_POLICY=first-party-jwt"
		}
	}
	// CA_ROOT_CA, in pilot-agent's order: PILOT_CERT_PROVIDER=custom, PROV_CERT,
	// PILOT_CERT_PROVIDER=none (no default), the istiod root.
	if c.CARoot == "" {
		switch {
		case c.PilotCertProvider == CertProviderCustom:
			c.CARoot = filepath.Join(c.FileMountedCertsDir, files.RootCertFile)
			r.notes["CA_ROOT_CA"] = "PILOT_CERT_PROVIDER=custom"
		case c.ProvCert != "":
			c.CARoot = filepath.Join(c.ProvCert, files.RootCertFile)
			r.notes["CA_ROOT_CA"] = "from PROV_CERT"
		case c.PilotCertProvider == CertProviderNone:
			r.notes["CA_ROOT_CA"] = "PILOT_CERT_PROVIDER=none: no default"
		default:
			c.CARoot = istioRootPath
		}
	}
	if c.XDSRoot == "" {
		mounted := filepath.Join(c.FileMountedCertsDir, files.RootCertFile)
		if in.FileExists(mounted) {
			c.XDSRoot = mounted
			r.notes["XDS_ROOT_CA"] = mounted + " exists"
		} else {
			c.XDSRoot = c.CARoot
			r.notes["XDS_ROOT_CA"] = "the CA root"
		}
	}
}

// invalid is an InvalidError for a value that conflicts with the others,
// naming the flag when the value came from one.
func (r *resolution) invalid(name, value, why string) error {
	if r.sources[name] == SourceFlag {
		if s := SettingByName(name); s != nil && s.Flag != "" {
			name = s.FlagName()
		}
	}
	return &InvalidError{Name: name, Value: value, Why: why}
}

// hostIP is the first address of addrs (net.InterfaceAddrs when nil) that is
// not loopback, link-local or unspecified, IPv4 before IPv6; 127.0.0.1 when
// there is none.
func hostIP(addrs func() ([]net.Addr, error)) string {
	if addrs == nil {
		addrs = net.InterfaceAddrs
	}
	list, _ := addrs()
	var v6 string
	for _, a := range list {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip := n.IP
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast() {
			continue
		}
		if ip.To4() != nil {
			return ip.String()
		}
		if v6 == "" {
			v6 = ip.String()
		}
	}
	if v6 != "" {
		return v6
	}
	return "127.0.0.1"
}

// from records that a setting's value was derived from another setting with
// source src.
func (r *resolution) from(name string, src Source, note string) {
	r.sources[name] = src
	r.notes[name] = note
}

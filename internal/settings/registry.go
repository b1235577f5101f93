package settings

import (
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/tlspolicy"
)

// NodeMaxStreams is the default of MESHAGENT_SDS_MAX_STREAMS and
// MESHAGENT_WORKLOAD_API_MAX_STREAMS in node mode: one node's pods share the
// bound (1,024 pods at MESHAGENT_SDS_MAX_STREAMS_PER_POD, or 16,384 at 4
// streams each). Sidecar mode's is DefaultMaxStreams.
const NodeMaxStreams = 65536

// The defaults below are defaults.go's constants, written as the registry
// shows them, so that each default is defined once.
func itoa(n int) string { return strconv.Itoa(n) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// dtoa writes a duration as a user would: "1m", "24h", "100ms" (not
// "1m0s", "24h0m0s").
func dtoa(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Registry declares every setting, once. To add one: add a field to Config
// and an entry here; the CLI flag, `meshagent config` and
// docs/configuration.md follow (run `make docs`). A default computed from
// other settings also needs a line in derive.go.
var Registry = []Setting{
	// Istio-compatible: pilot-agent's names and defaults.
	{
		Name: "CA_ADDR", Flag: "ca-addr", Group: GroupIstio,
		DerivedDefault: "the discovery address (PROXY_CONFIG discoveryAddress); for CA_PROVIDER=Linkerd, linkerd-identity.<MESHAGENT_LINKERD_NAMESPACE>.svc.<TRUST_DOMAIN>:8080",
		Doc:            "Address (host:port) of the CA that signs workload certificates.",
		Value:          HostPort(func(c *Config) *string { return &c.CAAddr }),
	},
	{
		Name: "CA_PROVIDER", Flag: "ca-provider", Default: ProviderIstio, Group: GroupIstio,
		Doc:   "CA protocol: Citadel is Istio's IstioCertificateService (istiod, istio-csr); Linkerd is Linkerd's identity service.",
		Value: Enum(func(c *Config) *string { return &c.CAProvider }, ProviderIstio, ProviderLinkerd),
	},
	{
		Name: "CA_ROOT_CA", Flag: "ca-root", Group: GroupIstio,
		DerivedDefault: "<MESHAGENT_FILE_MOUNTED_CERTS_DIR>/root-cert.pem for PILOT_CERT_PROVIDER=custom, else PROV_CERT/root-cert.pem when PROV_CERT is set, else none for PILOT_CERT_PROVIDER=none, else ./var/run/secrets/istio/root-cert.pem",
		Doc:            "Root bundle that verifies the CA's TLS certificate and the certificates it issues; SYSTEM means the system trust store. Watched for changes.",
		Value:          CARoot(func(c *Config) *string { return &c.CARoot }),
	},
	{
		Name: "XDS_ROOT_CA", Flag: "xds-root", Group: GroupIstio,
		DerivedDefault: "<MESHAGENT_FILE_MOUNTED_CERTS_DIR>/root-cert.pem when that file exists at start-up, else the CA root",
		Doc:            "Root bundle that verifies the control plane's TLS certificate; SYSTEM means the system trust store.",
		Value:          CARoot(func(c *Config) *string { return &c.XDSRoot }),
	},
	{
		Name: "PILOT_CERT_PROVIDER", Default: "istiod", Group: GroupIstio,
		Doc: "Who signs the control plane's serving certificate; it chooses the default CA root, as in pilot-agent. " +
			"istiod: ./var/run/secrets/istio/root-cert.pem. custom: <MESHAGENT_FILE_MOUNTED_CERTS_DIR>/root-cert.pem. " +
			"none: no default root, so CA_ROOT_CA or PROV_CERT must be set (except with FILE_MOUNTED_CERTS=true or in dev mode, where the xDS proxy still needs XDS_ROOT_CA or the file-mounted root); the agent refuses to start otherwise. " +
			"kubernetes is accepted and treated as istiod, with a warning at start-up.",
		Value:  Enum(func(c *Config) *string { return &c.PilotCertProvider }, CertProviderIstiod, CertProviderKubernetes, CertProviderCustom, CertProviderNone),
		Unused: pilotCertProviderUnused,
	},
	{
		Name: "ISTIOD_SAN", Group: GroupIstio,
		DerivedDefault: "the host part of the address dialled",
		Doc:            "Name the CA's and control plane's TLS certificates must carry.",
		Value:          String(func(c *Config) *string { return &c.IstiodSAN }),
	},
	{
		Name: "CA_HEADER_<NAME>", Group: GroupIstio,
		Doc:   "Each variable `CA_HEADER_<NAME>=<value>` adds gRPC metadata `<NAME>: <value>` to every CA request. Values are redacted in `meshagent config`.",
		Value: Headers(func(c *Config) *map[string]string { return &c.CAHeaders }),
	},
	{
		Name: "XDS_HEADER_<NAME>", Group: GroupIstio,
		Doc:   "Each variable `XDS_HEADER_<NAME>=<value>` adds gRPC metadata `<NAME>: <value>` to the control-plane stream. Values are redacted in `meshagent config`.",
		Value: Headers(func(c *Config) *map[string]string { return &c.XDSHeaders }),
	},
	{
		Name: "TRUST_DOMAIN", Flag: "trust-domain", Default: "cluster.local", Group: GroupIstio,
		Doc:   "Trust domain of the workload's SPIFFE ID.",
		Value: TrustDomain(func(c *Config) *string { return &c.TrustDomain }),
	},
	{
		Name: "POD_NAME", Group: GroupIstio,
		Doc:   "Name of the pod (or VM) the agent runs beside.",
		Value: String(func(c *Config) *string { return &c.PodName }),
	},
	{
		Name: "POD_NAMESPACE", Group: GroupIstio,
		DerivedDefault: "default in --dev mode; required otherwise",
		Doc:            "Namespace of the workload; part of its identity.",
		Value:          Label(func(c *Config) *string { return &c.PodNamespace }),
	},
	{
		Name: "SERVICE_ACCOUNT", Group: GroupIstio,
		DerivedDefault: "default in --dev mode; required otherwise",
		Doc:            "Service account of the workload; part of its identity.",
		Value:          Label(func(c *Config) *string { return &c.ServiceAccount }),
	},
	{
		Name: "INSTANCE_IP", Group: GroupIstio,
		DerivedDefault: "the host's first non-loopback, non-link-local address (IPv4 first), else 127.0.0.1",
		Doc:            "IP address of the workload; the second field of the gRPC bootstrap's node ID (sidecar~<INSTANCE_IP>~<POD_NAME>.<POD_NAMESPACE>~<POD_NAMESPACE>.svc.cluster.local).",
		Value:          IP(func(c *Config) *string { return &c.InstanceIP }),
	},
	{
		Name: "ISTIO_META_CLUSTER_ID", Group: GroupIstio,
		Doc:   "Cluster ID, sent to the CA and the control plane as ClusterID gRPC metadata.",
		Value: String(func(c *Config) *string { return &c.ClusterID }),
	},
	{
		Name: "ISTIO_META_CERT_SIGNER", Group: GroupIstio,
		Doc:   "Signer name sent as CertSigner in the Istio CSR request's metadata.",
		Value: String(func(c *Config) *string { return &c.CertSigner }),
	},
	{
		Name: "JWT_POLICY", Default: "third-party-jwt", Group: GroupIstio,
		Doc:   "Which service-account token authenticates to the CA: third-party-jwt (projected token, audience istio-ca) or first-party-jwt (the default service-account token).",
		Value: Enum(func(c *Config) *string { return &c.JWTPolicy }, "third-party-jwt", "first-party-jwt"),
	},
	{
		Name: "CREDENTIAL_FETCHER_TYPE", Default: FetcherJWT, Group: GroupIstio,
		Doc:   "Where the bearer token for the CA and the control plane comes from: JWT reads the token file (MESHAGENT_TOKEN_PATH) at every request; TokenRequest asks the Kubernetes API for a token of SERVICE_ACCOUNT bound to the pod POD_NAME (POD_UID), kept in memory only. See docs/tokens.md.",
		Value: Enum(func(c *Config) *string { return &c.CredentialFetcherType }, FetcherJWT, FetcherTokenRequest),
	},
	{
		Name: "CREDENTIAL_IDENTITY_PROVIDER", Group: GroupIstio,
		DerivedDefault: "istio-ca; identity.l5d.io for CA_PROVIDER=Linkerd",
		Doc:            "Audience of the tokens asked for with CREDENTIAL_FETCHER_TYPE=TokenRequest: the audience the CA checks.",
		Value:          String(func(c *Config) *string { return &c.CredentialIdentityProvider }),
		Unused:         tokenRequestOnly,
	},
	{
		Name: "PROV_CERT", Flag: "prov-cert", Group: GroupIstio,
		Doc:   "Directory holding a provisioning certificate (cert-chain.pem, key.pem, root-cert.pem) presented to the CA as client certificate, e.g. on VMs.",
		Value: Path(func(c *Config) *string { return &c.ProvCert }),
	},
	{
		Name: "OUTPUT_CERTS", Flag: "output-certs", Group: GroupIstio,
		DerivedDefault: ProxylessOutputCerts + " when a gRPC bootstrap is written (DISABLE_ENVOY=true or GRPC_XDS_BOOTSTRAP set), as Istio's proxyless template sets it; else none",
		Doc: "Directory to write cert-chain.pem, key.pem (0600) and root-cert.pem to on every rotation; empty writes nothing. " +
			"The gRPC bootstrap's certificate provider names these files, so a bootstrap always comes with them.",
		Value: Path(func(c *Config) *string { return &c.OutputCerts }),
	},
	{
		Name: "FILE_MOUNTED_CERTS", Default: "false", Group: GroupIstio,
		Doc:   "Serve the certificates in MESHAGENT_FILE_MOUNTED_CERTS_DIR (./etc/certs) instead of asking a CA.",
		Value: Bool(func(c *Config) *bool { return &c.FileMountedCerts }),
		Unused: func(c *Config, _ bool) string {
			if c.Dev && c.FileMountedCerts {
				return "--dev (MESHAGENT_DEV) comes first: the in-process CA issues the certificate and " + c.FileMountedCertsDir + " is not served; drop one of the two"
			}
			return ""
		},
	},
	{
		Name: "SECRET_TTL", Default: dtoa(DefaultSecretTTL), Group: GroupIstio,
		Doc:   "Certificate lifetime asked of the CA.",
		Value: Duration(func(c *Config) *time.Duration { return &c.SecretTTL }, time.Second),
	},
	{
		Name: "SECRET_GRACE_PERIOD_RATIO", Default: ftoa(DefaultGraceRatio), Group: GroupIstio,
		DerivedDefault: ftoa(DefaultGraceRatio) + "; " + ftoa(pki.LinkerdGraceRatio) + " for CA_PROVIDER=Linkerd",
		Doc:            "Share of a certificate's life left when it is renewed (0.5 renews at half-life). 0 is refused (it would renew only after expiry). Whatever the ratio, a certificate is not renewed sooner than 1% of its life after it arrived (at least 5 s, at most half its life).",
		Value:          GraceRatio(func(c *Config) *float64 { return &c.GraceRatio }),
	},
	{
		Name: "SECRET_GRACE_PERIOD_RATIO_JITTER", Default: ftoa(DefaultGraceJitter), Group: GroupIstio,
		Doc:   "Random ± jitter added to the grace period ratio so renewals do not stampede.",
		Value: Float(func(c *Config) *float64 { return &c.GraceJitter }, 0, 1),
	},
	{
		Name: "FILE_DEBOUNCE_DURATION", Default: "100ms", Group: GroupIstio,
		Doc:   "How long watched files must stay unchanged before they are reloaded.",
		Value: Duration(func(c *Config) *time.Duration { return &c.FileDebounce }, time.Millisecond),
	},
	{
		Name: "WORKLOAD_RSA_KEY_SIZE", Default: "2048", Group: GroupIstio,
		Doc:   "RSA key size. When set (and ECC_SIGNATURE_ALGORITHM is not ECDSA) the workload key is RSA of this size, as in pilot-agent.",
		Value: IntChoice(func(c *Config) *int { return &c.WorkloadRSAKeySize }, 2048, 3072, 4096),
	},
	{
		Name: "ECC_SIGNATURE_ALGORITHM", Group: GroupIstio,
		Doc:   "ECDSA selects an EC workload key on ECC_CURVE, as in pilot-agent; RSA selects an RSA key of WORKLOAD_RSA_KEY_SIZE.",
		Value: Enum(func(c *Config) *string { return &c.ECCSignatureAlgorithm }, "ECDSA", "RSA"),
	},
	{
		Name: "ECC_CURVE", Default: "P256", Group: GroupIstio,
		Doc:   "Curve of an EC workload key.",
		Value: Enum(func(c *Config) *string { return &c.ECCCurve }, "P256", "P384"),
	},
	{
		Name: "GRPC_XDS_BOOTSTRAP", Flag: "grpc-bootstrap", Default: "etc/istio/proxy/grpc-bootstrap.json", Group: GroupIstio,
		Doc:   "Where the gRPC xDS bootstrap for proxyless gRPC is written.",
		Value: Path(func(c *Config) *string { return &c.GRPCXDSBootstrap }),
	},
	{
		Name: "DISABLE_ENVOY", Default: "false", Group: GroupIstio,
		Doc: "No Envoy runs beside the agent (proxyless gRPC or VM): the SDS socket and the SPIFFE Workload API on it are not served; " +
			"the certificates are written to OUTPUT_CERTS and the gRPC bootstrap (GRPC_XDS_BOOTSTRAP) names them.",
		Value: Bool(func(c *Config) *bool { return &c.DisableEnvoy }),
	},
	{
		Name: "PROXY_CONFIG", Group: GroupIstio,
		Default: `{"discoveryAddress":"istiod.istio-system.svc:15012","statusPort":15020,"terminationDrainDuration":"5s"}`,
		Doc: "Istio ProxyConfig as JSON. meshagent reads discoveryAddress (the control plane, host:port), statusPort and " +
			"terminationDrainDuration (how long a sidecar keeps serving SDS, the Workload API and the xDS proxy after SIGTERM, " +
			"as pilot-agent keeps Envoy; not in node mode nor with DISABLE_ENVOY=true; docs/operations.md); other fields are ignored.",
		Value:  JSON(setProxyConfig, showProxyConfig),
		Unused: proxyConfigUnused,
	},
	{
		Name: "STATUS_PORT", Flag: "status-port", Group: GroupIstio,
		DerivedDefault: "PROXY_CONFIG statusPort, else 15020",
		Doc:            "Port of the status server (/healthz/ready, /healthz/started, /healthz/live, /metrics, /debug/certs); 0 picks a free port.",
		Value:          Int(func(c *Config) *int { return &c.StatusPort }, 0, 65535),
	},
	{
		Name: "WORKLOAD_IDENTITY_SOCKET_FILE", Default: "socket", Group: GroupIstio,
		Doc:   "File name of the SDS socket in ./var/run/secrets/workload-spiffe-uds/.",
		Value: FileName(func(c *Config) *string { return &c.WorkloadIdentitySocketFile }),
	},
	{
		Name: "COMPLIANCE_POLICY", Group: GroupIstio,
		Doc: "TLS policy of the connections the agent makes (the CA, the control plane), as pilot-agent applies it: " +
			"fips-140-2: TLS 1.2 only, the ECDHE AES-GCM suites, P-256; fips-140-3: TLS 1.2 and 1.3, those suites, P-256 and P-384 (and a warning unless Go's FIPS 140-3 mode is on: GODEBUG=fips140=on, see make build-fips); " +
			"pqc: TLS 1.3 only with the X25519MLKEM768 key exchange alone. Empty: Go's defaults. The policy and the crypto module in force are logged at start-up.",
		Value: Enum(func(c *Config) *tlspolicy.Policy { return &c.CompliancePolicy }, tlspolicy.Policies...),
	},

	// meshagent's own settings.
	{
		Name: "MESHAGENT_KEY_TYPE", Flag: "key-type", Default: string(pki.ECP256), Group: GroupMeshagent,
		DerivedDefault: "ec-p256; ec-p256/ec-p384 when ECC_SIGNATURE_ALGORITHM=ECDSA (by ECC_CURVE); rsa-<WORKLOAD_RSA_KEY_SIZE> when WORKLOAD_RSA_KEY_SIZE is set or ECC_SIGNATURE_ALGORITHM=RSA",
		Doc:            "Workload key type. When set it wins over ECC_SIGNATURE_ALGORITHM and WORKLOAD_RSA_KEY_SIZE.",
		Value:          KeyType(func(c *Config) *pki.KeyType { return &c.KeyType }),
	},
	{
		Name: "MESHAGENT_LINKERD_NAMESPACE", Default: "linkerd", Group: GroupMeshagent,
		Doc:   "Namespace of the Linkerd control plane (CA_PROVIDER=Linkerd); part of the Linkerd identity.",
		Value: Label(func(c *Config) *string { return &c.LinkerdNamespace }),
	},
	{
		Name: "MESHAGENT_LINKERD_IDENTITY_SERVICE_NAME", Group: GroupMeshagent,
		DerivedDefault: "linkerd-identity.<ns>.serviceaccount.identity.<ns>.<TRUST_DOMAIN> with <ns> = MESHAGENT_LINKERD_NAMESPACE",
		Doc:            "TLS name the Linkerd identity service must present.",
		Value:          String(func(c *Config) *string { return &c.LinkerdIdentityServiceName }),
	},
	{
		Name: "POD_UID", Group: GroupIstio,
		Doc:   "UID of the pod the agent runs beside (from the downward API, metadata.uid). With CREDENTIAL_FETCHER_TYPE=TokenRequest tokens are bound to this exact pod; empty binds them to whichever pod is named POD_NAME.",
		Value: String(func(c *Config) *string { return &c.PodUID }),
	},
	{
		Name: "KUBECONFIG", Flag: "kubeconfig", Group: GroupIstio,
		Doc:   "Kubernetes client configuration files, as for kubectl (a list separated by ':'). Empty: the in-cluster configuration of the pod's service account. Used by CREDENTIAL_FETCHER_TYPE=TokenRequest.",
		Value: Path(func(c *Config) *string { return &c.Kubeconfig }),
	},
	{
		Name: "MESHAGENT_TOKEN_LIFETIME", Default: "1h", Group: GroupMeshagent,
		Doc:    "Lifetime asked for the tokens of CREDENTIAL_FETCHER_TYPE=TokenRequest; the API server's minimum is 10m.",
		Value:  Duration(func(c *Config) *time.Duration { return &c.TokenLifetime }, 10*time.Minute),
		Unused: tokenRequestOnly,
	},
	{
		Name: "MESHAGENT_TOKEN_REFRESH_RATIO", Default: "0.8", Group: GroupMeshagent,
		Doc:    "Share of a TokenRequest token's life after which the next request uses a new token (0.8, as the kubelet). Lower values only serve tests that must see a refresh without waiting minutes.",
		Value:  Float(func(c *Config) *float64 { return &c.TokenRefreshRatio }, 0.001, 1),
		Unused: tokenRequestOnly,
	},
	{
		Name: "MESHAGENT_STATUS_HOST", Flag: "status-host", Group: GroupMeshagent,
		Doc:   "Host or IP the status server listens on; empty means every interface (as pilot-agent).",
		Value: String(func(c *Config) *string { return &c.StatusHost }),
	},
	{
		Name: "MESHAGENT_LOG_LEVEL", Flag: "log-level", Default: "info", Group: GroupMeshagent,
		Doc:   "Log level. Logs are JSON, or human-readable when stderr is a terminal.",
		Value: Enum(func(c *Config) *string { return &c.LogLevel }, "debug", "info", "warn", "error"),
	},
	{
		Name: "MESHAGENT_DEV", Flag: "dev", Default: "false", Group: GroupMeshagent,
		Doc:   "Development mode: an in-process CA with a fresh in-memory root issues the workload certificate. Not for production.",
		Value: Bool(func(c *Config) *bool { return &c.Dev }),
	},
	{
		Name: "MESHAGENT_XDS_PROXY", Flag: "xds-proxy", DerivedDefault: "true, except in dev mode", Group: GroupMeshagent,
		Doc:   "Run the xDS proxy: Envoy's (or proxyless gRPC's) ADS stream on the xDS socket is forwarded to the discovery address.",
		Value: Bool(func(c *Config) *bool { return &c.XDSProxy }),
	},
	{
		Name: "MESHAGENT_SDS_MAX_STREAMS", Flag: "sds-max-streams", DerivedDefault: itoa(DefaultMaxStreams) + "; in node mode " + itoa(NodeMaxStreams) + " (1,024 pods at MESHAGENT_SDS_MAX_STREAMS_PER_POD, or 16,384 pods at 4 streams each)", Group: GroupMeshagent,
		Doc:   "Most SDS streams served at once, from all callers together; a stream over the limit is refused with gRPC status RESOURCE_EXHAUSTED.",
		Value: Int(func(c *Config) *int { return &c.SDSMaxStreams }, 1, 1<<20),
	},
	{
		Name: "MESHAGENT_SDS_MAX_STREAMS_PER_POD", Default: itoa(DefaultMaxStreamsPerPod), Group: GroupMeshagent,
		Doc:   "Node mode: most streams one pod holds at once, SDS and Workload API streams counted together (a caller resolved to no pod is counted by its identity); one more is refused with gRPC status RESOURCE_EXHAUSTED, so a pod cannot take the places of the others. Not applied in sidecar mode, where every caller is the one workload.",
		Value: Int(func(c *Config) *int { return &c.SDSMaxStreamsPerPod }, 1, 1<<20),
	},
	{
		Name: "MESHAGENT_SDS_MAX_FILE_RESOURCES_PER_CALLER", Default: itoa(DefaultMaxFileResourcesPerCaller), Group: GroupMeshagent,
		Doc:   "Most file-cert: and file-root: resources one caller's SDS streams hold at once (a caller is its pod in node mode, else its connecting process), out of the 64 the agent holds in all, so no caller starves the others; one more is refused with gRPC status RESOURCE_EXHAUSTED naming it. Raise it when one proxy needs more (64 or more lets one caller take them all).",
		Value: Int(func(c *Config) *int { return &c.SDSMaxFileResourcesPerCaller }, 1, 1<<20),
	},
	{
		Name: "MESHAGENT_SDS_MAX_RECV_BYTES", Flag: "sds-max-recv-bytes", Default: itoa(DefaultMaxRecvBytes), Group: GroupMeshagent,
		Doc:   "Largest SDS request accepted, in bytes; a larger one is refused with gRPC status RESOURCE_EXHAUSTED.",
		Value: Int(func(c *Config) *int { return &c.SDSMaxRecvBytes }, 1024, 16<<20),
	},
	{
		Name: "MESHAGENT_CA_MAX_CONCURRENT_CSRS", Default: itoa(DefaultMaxConcurrentCSRs), Group: GroupMeshagent,
		Doc:   "Most certificate requests in flight to the CA at once, across all identities; further identities wait their turn (a caller waiting first, then first certificates, then renewals).",
		Value: Int(func(c *Config) *int { return &c.CAMaxConcurrentCSRs }, 1, 1024),
	},
	{
		Name: "MESHAGENT_IDENTITY_IDLE_GRACE", Default: dtoa(DefaultIdentityIdleGrace), Group: GroupMeshagent,
		Doc:   "How long a workload identity nobody holds any more (no stream, no waiting caller, no pod on the node) keeps its certificate before it is dropped; a caller back within it is served at once. The agent's own identity is never dropped.",
		Value: Duration(func(c *Config) *time.Duration { return &c.IdentityIdleGrace }, time.Second),
	},
	{
		Name: "MESHAGENT_SDS_ALLOWED_UIDS", Flag: "sds-allowed-uids", Group: GroupMeshagent,
		Doc:   "Comma-separated uids allowed to use the SDS socket (checked with SO_PEERCRED); others get PERMISSION_DENIED. Empty lets anyone who can open the socket in.",
		Value: UIDs(func(c *Config) *[]uint32 { return &c.SDSAllowedUIDs }),
	},
	{
		Name: "MESHAGENT_FILE_RESOURCE_DIRS", Group: GroupMeshagent, Default: DefaultFileResourceDirs,
		Doc: "Comma-separated directories whose files SDS file-cert: and file-root: resources may name (a relative one is against the working directory); " +
			"a file elsewhere, as named or through a symbolic link, is refused, so a caller of the socket cannot have the agent read any PEM it can read. " +
			"The defaults are Istio's certificate, credential and root directories and the system CA directories; " +
			"the directories of MESHAGENT_FILE_MOUNTED_CERTS_DIR, MESHAGENT_WORKLOAD_CREDENTIALS_DIR and CA_ROOT_CA are always allowed. " +
			"Not applied when MESHAGENT_SDS_ALLOWED_UIDS limits the socket to trusted uids. `/` allows every file.",
		Value: String(func(c *Config) *string { return &c.FileResourceDirs }),
	},
	{
		Name: "MESHAGENT_MODE", Flag: "mode", Default: ModeSidecar, Group: GroupMeshagent,
		Doc:   "sidecar serves one workload (the agent's own identity); node serves every pod of the node over one socket, each caller identified by the kernel (SO_PEERCRED pid, cgroup, pod) and given its pod's identity (docs/node-mode.md). `meshagent run --node` is the same as node.",
		Value: Enum(func(c *Config) *string { return &c.Mode }, ModeSidecar, ModeNode),
	},
	{
		Name: "NODE_NAME", Group: GroupIstio,
		DerivedDefault: "required in node mode",
		Doc:            "Name of the node the agent runs on (node mode): only pods with spec.nodeName equal to it are served.",
		Value:          String(func(c *Config) *string { return &c.NodeName }),
	},
	{
		Name: "MESHAGENT_NODE_UID_IDENTITIES", Group: GroupMeshagent,
		Doc: "Node mode: identities of node processes outside any pod, by uid, as `<uid>=<spiffe id>` separated by commas. A node process whose uid is not listed is refused. " +
			"An entry for uid 0 gives its identity to every root process of the node outside the pods' cgroups (the kubelet, the container runtime, every system service, any root login): list uid 0 only if all of them may hold that identity.",
		Value: NodeUIDs(func(c *Config) *map[uint32]pki.Identity { return &c.NodeUIDIdentities }),
	},
	{
		Name: "MESHAGENT_NODE_CGROUP_ROOT", Group: GroupMeshagent,
		Doc: "Node mode: where the kubelet makes pod cgroups, as absolute cgroup paths separated by commas, each ending in its kubepods component (`/kubepods`, `/kubepods.slice`, `/x/kubepods` for a kubelet with `cgroupRoot: /x`). " +
			"A caller counts as a pod's only when its cgroup sits exactly there: a kubepods tree anywhere else (a delegated subtree of a node user, a systemd service or a machine) is refused. " +
			"Empty: the root of the agent's own pod, learned from its cgroup, else the top-level `/kubepods` (cgroupfs driver) and `/kubepods.slice` (systemd driver).",
		Value: String(func(c *Config) *string { return &c.NodeCgroupRoot }),
	},
	{
		Name: "MESHAGENT_NODE_PREFETCH_ALL", Default: "false", Group: GroupMeshagent,
		Doc: "Node mode: fetch a certificate ahead for every service account with a pod on the node (kube-system included). " +
			"Off: only for pods that mount the agent's CSI volume (csi.meshagent.io) or are annotated `meshagent.io/prefetch: \"true\"` (`\"false\"`: never); the others get theirs on their first request.",
		Value: Bool(func(c *Config) *bool { return &c.NodePrefetchAll }),
	},
	{
		Name: "MESHAGENT_NODE_POD_TOKENS_DIR", Default: "./var/run/meshagent/pod-tokens", Group: GroupMeshagent,
		Doc: "Node mode with CA_PROVIDER=Linkerd: the directory in which the node's CSI driver (`meshagent csi --token-dir`) hands over " +
			"each pod's service-account token for Linkerd's identity audience, one file per pod UID, as the kubelet gives it to the driver " +
			"(the CSIDriver's tokenRequests and requiresRepublish). Each identity's CSR carries the token of a pod of its service account " +
			"on the node: the agent creates no token.",
		Value: String(func(c *Config) *string { return &c.NodePodTokensDir }),
	},
	{
		Name: "MESHAGENT_NODE_FILE_RESOURCES", Default: "false", Group: GroupMeshagent,
		Doc: "Node mode: serve `file-cert:` and `file-root:` SDS resources (files of the node). Off by default, and refused then: " +
			"with it on, ANY pod on the node can read any certificate, key or bundle file the agent can read, by naming its path. " +
			"Turn it on only when every pod of the node may read those files (docs/node-mode.md). No effect in sidecar mode, where they are always served.",
		Value: Bool(func(c *Config) *bool { return &c.NodeFileResources }),
	},
	{
		Name: "MESHAGENT_POD_CERTIFICATE_SIGNER", Group: GroupMeshagent,
		Doc: "Node mode: the signer name under which the agent signs Kubernetes PodCertificateRequests of its node's pods " +
			"(podCertificate projected volumes), e.g. `meshagent.io/workload-identity`. " +
			"The agent publishes no trust: the mesh roots' ClusterTrustBundle is written by one `meshagent trust-publisher` per cluster. Empty: off. Needs the RBAC the chart grants with node.podCertificateSigner (docs/pod-certificates.md). No effect in sidecar mode.",
		Value: String(func(c *Config) *string { return &c.PodCertificateSigner }),
		Unused: func(c *Config, set bool) string {
			if set && c.Mode != ModeNode {
				return "only node mode (MESHAGENT_MODE=node) signs pod certificates"
			}
			return ""
		},
	},
	{
		Name: "MESHAGENT_BROKER_SOCKET", Group: GroupMeshagent,
		Doc: "Node mode: the Unix socket on which the agent serves the SPIFFE Broker API (spiffe.broker.API) to the brokers of MESHAGENT_BROKERS, over mutual TLS with X509-SVIDs (docs/broker-api.md). " +
			"Give it a directory of its own, mounted only into the brokers' pods. Empty: not served. Refused outside node mode.",
		Value: Path(func(c *Config) *string { return &c.BrokerSocket }),
	},
	{
		Name: "MESHAGENT_BROKERS", Group: GroupMeshagent,
		Doc: "Node mode: the brokers allowed on MESHAGENT_BROKER_SOCKET, by the SPIFFE ID of their X509-SVID, each with the reference types it may use: `pid` (a process on the node) and `pod` (a pod of the node by name and/or UID); " +
			"e.g. `spiffe://cluster.local/ns/istio-system/sa/ztunnel=pod;spiffe://cluster.local/ns/tunnel/sa/agent=pid,pod`. Any other caller is refused with PERMISSION_DENIED. " +
			"A broker gets the keys of every workload of the node it names: list only node components trusted that far (docs/broker-api.md).",
		Value: BrokerList(func(c *Config) *[]Broker { return &c.Brokers }),
		Unused: func(c *Config, set bool) string {
			if set && c.BrokerSocket == "" {
				return "the Broker API is served only with MESHAGENT_BROKER_SOCKET set"
			}
			return ""
		},
	},
	{
		Name: "MESHAGENT_BROKER_MAX_STREAMS", Default: itoa(DefaultBrokerMaxStreams), Group: GroupMeshagent,
		Doc:   "Node mode: most SPIFFE Broker API streams one broker holds open at once; one more is refused with gRPC status RESOURCE_EXHAUSTED naming this setting.",
		Value: Int(func(c *Config) *int { return &c.BrokerMaxStreams }, 1, 1<<20),
	},
	{
		Name: "MESHAGENT_BROKER_MAX_WORKLOADS", Default: itoa(DefaultBrokerMaxWorkloads), Group: GroupMeshagent,
		Doc:   "Node mode: most distinct workloads (pods) one broker holds SPIFFE Broker API streams for at once; a stream for one more is refused with gRPC status RESOURCE_EXHAUSTED naming this setting.",
		Value: Int(func(c *Config) *int { return &c.BrokerMaxWorkloads }, 1, 1<<20),
	},
	{
		Name: "MESHAGENT_WORKLOAD_API", Flag: "workload-api", Default: "true", Group: GroupMeshagent,
		Doc:   "Serve the SPIFFE Workload API (X.509-SVIDs and bundles, for go-spiffe, spiffe-helper and other SPIFFE clients) on the SDS socket beside SDS. Set SPIFFE_ENDPOINT_SOCKET=unix://<SDS socket> in the clients.",
		Value: Bool(func(c *Config) *bool { return &c.WorkloadAPI }),
	},
	{
		Name: "MESHAGENT_WORKLOAD_API_MAX_STREAMS", DerivedDefault: itoa(DefaultMaxStreams) + "; in node mode " + itoa(NodeMaxStreams) + ", as MESHAGENT_SDS_MAX_STREAMS", Group: GroupMeshagent,
		Doc:   "Most Workload API streams (FetchX509SVID, FetchX509Bundles) served at once, from all callers together; one more is refused with gRPC status RESOURCE_EXHAUSTED. Each pod's share is bounded by MESHAGENT_SDS_MAX_STREAMS_PER_POD.",
		Value: Int(func(c *Config) *int { return &c.WorkloadAPIMaxStreams }, 1, 1<<20),
	},
	{
		Name: "MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER", Default: itoa(DefaultSocketMaxConnsPerCaller), Group: GroupMeshagent,
		Doc:   "Most connections to the SDS socket one caller holds open: a pod in node mode, else the connecting process's uid (node processes, and every caller in sidecar mode). The caller is identified when it connects; one more connection is refused when accepted, without a gRPC transport: its first call gets gRPC status RESOURCE_EXHAUSTED naming this setting, then an HTTP/2 GOAWAY.",
		Value: Int(func(c *Config) *int { return &c.SocketMaxConnsPerCaller }, 1, 1<<20),
	},
	{
		Name: "MESHAGENT_SOCKET_MAX_CONNECTION_RATE_PER_CALLER", Default: itoa(DefaultSocketMaxConnRatePerCaller), Group: GroupMeshagent,
		Doc: "Most new connections to the SDS socket one caller opens a second (a pod in node mode, else the connecting process's uid), after a burst of MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER. " +
			"One more is refused when accepted, without a gRPC transport: its first call gets gRPC status RESOURCE_EXHAUSTED naming this setting, then an HTTP/2 GOAWAY.",
		Value: Int(func(c *Config) *int { return &c.SocketMaxConnRatePerCaller }, 1, 1<<20),
	},
	{
		Name: "MESHAGENT_SOCKET_MAX_STREAMS_PER_CONNECTION", Default: itoa(DefaultSocketMaxStreamsPerConn), Group: GroupMeshagent,
		Doc:   "Most RPCs open at once on one connection to the SDS socket (HTTP/2 MAX_CONCURRENT_STREAMS); gRPC clients wait for a place, others have the extra stream refused.",
		Value: Int(func(c *Config) *int { return &c.SocketMaxStreamsPerConn }, 1, 1<<20),
	},
	{
		Name: "MESHAGENT_SOCKET_MAX_UNARY_PER_CALLER", Default: itoa(DefaultSocketMaxUnaryPerCaller), Group: GroupMeshagent,
		Doc:   "Most unary calls (SDS FetchSecrets, Workload API FetchJWTSVID and the like) one caller is served at once; one more is refused with gRPC status RESOURCE_EXHAUSTED naming this setting.",
		Value: Int(func(c *Config) *int { return &c.SocketMaxUnaryPerCaller }, 1, 1<<20),
	},
	{
		Name: "MESHAGENT_SOCKET_MAX_QUEUED_BYTES_PER_CALLER", Default: itoa(DefaultSocketMaxQueuedBytesPerCaller), Group: GroupMeshagent,
		Doc:   "Most response bytes queued for one caller that it has not read (a client that stops reading or closes its HTTP/2 window); while over it, the caller's calls and stream updates are refused with gRPC status RESOURCE_EXHAUSTED naming this setting.",
		Value: Int(func(c *Config) *int { return &c.SocketMaxQueuedBytesPerCaller }, 64<<10, 1<<30),
	},
	{
		Name: "MESHAGENT_SOCKET_IDLE_TIMEOUT", Default: dtoa(DefaultSocketIdleTimeout), Group: GroupMeshagent,
		Doc:   "A connection to the SDS socket without any RPC for this long is closed (gRPC clients reconnect when they next call).",
		Value: Duration(func(c *Config) *time.Duration { return &c.SocketIdleTimeout }, time.Second),
	},

	// Trust bundle sources beside the root files (docs/trust.md).
	{
		Name: "MESHAGENT_TRUST_CONFIGMAP", Group: GroupMeshagent,
		Doc: "A ConfigMap key whose PEM roots are trusted beside the root files, followed through the API server (KUBECONFIG, else in-cluster; needs get, list and watch on configmaps of the namespace): " +
			"<namespace>/<name>[/<key>], key default root-cert.pem, e.g. istio-system/istio-ca-root-cert (the copy istiod writes in every namespace) or linkerd/linkerd-identity-trust-roots/ca-bundle.crt. " +
			"Its roots join the merged bundle (union with the files and the ClusterTrustBundles) that ROOTCA, the Workload API, OUTPUT_CERTS and the CA and xDS connections use; a change applies without a restart. " +
			"A deleted ConfigMap, a missing key or a bundle that does not parse is refused and its last good roots stay. Empty: none.",
		Value: ConfigMapKey(func(c *Config) *ConfigMapRef { return &c.TrustConfigMap }),
	},
	{
		Name: "MESHAGENT_TRUST_BUNDLE_SIGNER", Group: GroupMeshagent,
		Doc: "A signer name whose ClusterTrustBundles (certificates.k8s.io/v1, field spec.signerName) are trusted beside the root files, as Istio's ENABLE_CLUSTER_TRUST_BUNDLE_API publishes them; needs list and watch on clustertrustbundles. " +
			"The union of the signer's bundles joins the merged bundle; a bundle that does not parse is refused alone, and when none is left the signer's last good roots stay. Empty: none.",
		Value: SignerName(func(c *Config) *string { return &c.TrustBundleSigner }),
	},
	{
		Name: "MESHAGENT_CRL_FILE", Default: "./var/run/secrets/istio/crl/ca-crl.pem", Group: GroupMeshagent,
		Doc: "Certificate revocation lists (PEM X509 CRL blocks) served inline in ROOTCA's validation context (Envoy's crl), where pilot-agent reads istiod's istio-ca-crl ConfigMap. " +
			"Watched: a change is pushed without a restart; a file that does not parse is refused and the last good CRL stays; no file means no CRL. " +
			"Envoy then wants a CRL for every CA of a chain it checks (docs/trust.md). Empty: none.",
		Value: Path(func(c *Config) *string { return &c.CRLFile }),
	},

	// The rest of pilot-agent's certificate and xDS-proxy half: honoured, or
	// refused with one line.
	{
		Name: "PKCS8_KEY", Default: "false", Group: GroupIstio,
		Doc:    "pilot-agent: write workload keys as PKCS#8. meshagent always does (PRIVATE KEY over SDS, the Workload API and in OUTPUT_CERTS), so true changes nothing; false set explicitly (pilot-agent's SEC 1 / PKCS#1 keys) is not available and is logged at start-up as having no effect.",
		Value:  Bool(func(c *Config) *bool { return &c.PKCS8Key }),
		Unused: pkcs8Unused,
	},
	{
		Name: "XDS_AUTH_PROVIDER", Group: GroupIstio,
		Doc:   "pilot-agent: a provider of the xDS connection's credentials (gcp). None is supported: the xDS proxy sends the bearer token of CREDENTIAL_FETCHER_TYPE (and the workload certificate); any value stops the agent at start-up.",
		Value: NoneSupported(func(c *Config) *string { return &c.XDSAuthProvider }, "the xDS proxy authenticates with the token of CREDENTIAL_FETCHER_TYPE"),
	},
	{
		Name: "XDS_AUTH_PLAINTEXT", Default: "false", Group: GroupIstio,
		Doc:   "pilot-agent: send the token over a plaintext xDS connection (port 15010). Refused: a token goes over plaintext only to a loopback address; true stops the agent at start-up.",
		Value: Refused(func(c *Config) *bool { return &c.XDSAuthPlaintext }, "the token is sent over plaintext only to a loopback address"),
	},
	{
		Name: "PROXY_CONFIG_XDS_AGENT", Default: "false", Group: GroupIstio,
		Doc: "pilot-agent: take ProxyConfig from istiod over xDS. With true, the xDS proxy asks istiod for the ProxyConfig (type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig) on its own, on the upstream stream of every xDS client (state of the world or delta), and merges its caCertificatesPem (the mesh's extra roots) into the trust bundle, live (docs/trust.md). " +
			"A ProxyConfig whose roots do not parse is NACKed and its last good roots stay. Only the roots are read from it. Without an xDS proxy (MESHAGENT_XDS_PROXY=false, node mode) true has no effect and is logged at start-up.",
		Value:  Bool(func(c *Config) *bool { return &c.ProxyConfigXDSAgent }),
		Unused: proxyConfigXDSUnused,
	},
	{
		Name: "ISTIO_MULTIROOT_MESH", Default: "false", Group: GroupIstio,
		Doc: "pilot-agent: trust several roots at once. meshagent always does: every root of every trust source is served and verified with, merged across sources (docs/trust.md). " +
			"pilot-agent also takes the mesh's extra roots from the ProxyConfig over xDS, which meshagent reads with PROXY_CONFIG_XDS_AGENT=true: with true and neither that nor MESHAGENT_TRUST_CONFIGMAP or MESHAGENT_TRUST_BUNDLE_SIGNER, the agent says so at start-up.",
		Value:  Bool(func(c *Config) *bool { return &c.MultiRootMesh }),
		Unused: multiRootUnused,
	},

	// OUTPUT_CERTS files and reload hooks (docs/vm.md).
	{
		Name: "MESHAGENT_OUTPUT_CERTS_KEY_MODE", Default: "0600", Group: GroupMeshagent,
		Doc:    "Mode of OUTPUT_CERTS' key.pem and bundle file; 0640 or 0440 let MESHAGENT_OUTPUT_CERTS_GROUP read the key.",
		Value:  FileMode(func(c *Config) *fs.FileMode { return &c.OutputKeyMode }, 0o600, 0o640, 0o400, 0o440),
		Unused: outputCertsOnly,
	},
	{
		Name: "MESHAGENT_OUTPUT_CERTS_CERT_MODE", Default: "0644", Group: GroupMeshagent,
		Doc:    "Mode of OUTPUT_CERTS' cert-chain.pem and root-cert.pem.",
		Value:  FileMode(func(c *Config) *fs.FileMode { return &c.OutputCertMode }, certModes...),
		Unused: outputCertsOnly,
	},
	{
		Name: "MESHAGENT_OUTPUT_CERTS_GROUP", Group: GroupMeshagent,
		Doc:    "Group (name or numeric gid) given to every OUTPUT_CERTS file before it is renamed into place, so an application running as another user of that group can read them. Empty: the agent's group.",
		Value:  String(func(c *Config) *string { return &c.OutputGroup }),
		Unused: outputCertsOnly,
	},
	{
		Name: "MESHAGENT_OUTPUT_CERTS_BUNDLE_FILE", Group: GroupMeshagent,
		Doc:    "Name of an extra file in OUTPUT_CERTS holding the private key followed by the certificate chain, as Kubernetes podCertificate volumes write their credential bundle; replaced atomically with key.pem and cert-chain.pem, with the key's mode. Empty: none.",
		Value:  FileName(func(c *Config) *string { return &c.OutputBundleFile }),
		Unused: outputCertsOnly,
	},
	{
		Name: "MESHAGENT_SPIFFE_BUNDLE_MAP", Default: "true", Group: GroupMeshagent,
		Doc: "Write the trust bundle as a SPIFFE trust bundle map (gRFC A87: {\"trust_domains\": {\"<TRUST_DOMAIN>\": <JWK set>}}) to OUTPUT_CERTS/spiffe-bundle-map.json, again at every root change, and name it as spiffe_trust_bundle_map_file in the gRPC bootstrap's file_watcher, " +
			"so proxyless gRPC verifies peers per trust domain (grpc-go reads it with GRPC_EXPERIMENTAL_XDS_MTLS_SPIFFE=true, and then prefers it to root-cert.pem). Not for CA_PROVIDER=Linkerd, whose identities are not SPIFFE IDs.",
		Value:  Bool(func(c *Config) *bool { return &c.SPIFFEBundleMap }),
		Unused: outputCertsOnly,
	},
	{
		Name: "MESHAGENT_OUTPUT_CERTS_RELOAD_COMMAND", Group: GroupMeshagent,
		Doc: "Command run after every rotation or root change, once the OUTPUT_CERTS files are in place (as spiffe-helper's cmd): a program and its arguments separated by spaces, run without a shell, " +
			"with OUTPUT_CERTS=<dir> and OUTPUT_CERTS_FILES=<the files replaced, comma-separated> in its environment; killed with its process group after MESHAGENT_OUTPUT_CERTS_RELOAD_TIMEOUT. A failure is logged; the next change runs it again. Empty: none.",
		Value:  String(func(c *Config) *string { return &c.ReloadCommand }),
		Unused: outputCertsOnly,
	},
	{
		Name: "MESHAGENT_OUTPUT_CERTS_RELOAD_TIMEOUT", Default: "10s", Group: GroupMeshagent,
		Doc:    "How long MESHAGENT_OUTPUT_CERTS_RELOAD_COMMAND may run; the next write of the files waits for it at most this long.",
		Value:  Duration(func(c *Config) *time.Duration { return &c.ReloadTimeout }, 100*time.Millisecond),
		Unused: outputCertsOnly,
	},
	{
		Name: "MESHAGENT_OUTPUT_CERTS_RELOAD_PID_FILE", Group: GroupMeshagent,
		Doc:    "File holding the pid of a process to send MESHAGENT_OUTPUT_CERTS_RELOAD_SIGNAL after every rotation or root change, once the files are in place (as spiffe-helper's pid_file_name). Empty: none.",
		Value:  Path(func(c *Config) *string { return &c.ReloadPIDFile }),
		Unused: outputCertsOnly,
	},
	{
		Name: "MESHAGENT_OUTPUT_CERTS_RELOAD_PROCESS", Group: GroupMeshagent,
		Doc:    "Name of processes to send MESHAGENT_OUTPUT_CERTS_RELOAD_SIGNAL after every rotation or root change: every process the agent sees in /proc (its pid namespace; a pod needs shareProcessNamespace) whose command name or first argument's base name is this. Empty: none.",
		Value:  String(func(c *Config) *string { return &c.ReloadProcess }),
		Unused: outputCertsOnly,
	},
	{
		Name: "MESHAGENT_OUTPUT_CERTS_RELOAD_SIGNAL", Default: "SIGHUP", Group: GroupMeshagent,
		Doc:    "Signal sent to MESHAGENT_OUTPUT_CERTS_RELOAD_PID_FILE's and MESHAGENT_OUTPUT_CERTS_RELOAD_PROCESS's processes.",
		Value:  Enum(func(c *Config) *string { return &c.ReloadSignal }, "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGTERM", "SIGQUIT", "SIGWINCH"),
		Unused: outputCertsOnly,
	},

	// Paths, relative to the working directory as in pilot-agent.
	{
		Name: "MESHAGENT_SDS_SOCKET", Flag: "sds-socket", Group: GroupPaths,
		DerivedDefault: "./var/run/secrets/workload-spiffe-uds/<WORKLOAD_IDENTITY_SOCKET_FILE>",
		Doc:            "Unix socket the SDS server listens on (and where an existing agent is looked for).",
		Value:          Path(func(c *Config) *string { return &c.SDSSocket }),
	},
	{
		Name: "MESHAGENT_SOCKET_HANDOFF", Group: GroupPaths,
		Doc: "Private socket of a socket holder (`meshagent socket-holder`, a process that outlives the agent's: the node chart runs it in a pod of its own) that keeps MESHAGENT_SDS_SOCKET answering, and the connections made to it waiting, while the agent is away: " +
			"the agent takes the listening socket and those connections from it by descriptor passing (or binds the socket and gives it), and leaves it to the holder when it exits. Empty: the agent binds the socket itself and removes it when it exits. docs/node-mode.md, \"Restarts\".",
		Value: Path(func(c *Config) *string { return &c.SocketHandoff }),
	},
	{
		Name: "MESHAGENT_XDS_SOCKET", Flag: "xds-socket", Default: "./etc/istio/proxy/XDS", Group: GroupPaths,
		Doc:   "Unix socket the xDS proxy listens on.",
		Value: Path(func(c *Config) *string { return &c.XDSSocket }),
	},
	{
		Name: "MESHAGENT_WORKLOAD_CREDENTIALS_DIR", Flag: "workload-credentials-dir", Default: "./var/run/secrets/workload-spiffe-credentials", Group: GroupPaths,
		Doc:   "Directory of pre-provisioned credentials; served when it holds cert-chain.pem, key.pem and root-cert.pem.",
		Value: Path(func(c *Config) *string { return &c.WorkloadCredentialsDir }),
	},
	{
		Name: "MESHAGENT_FILE_MOUNTED_CERTS_DIR", Flag: "file-mounted-certs-dir", Default: "./etc/certs", Group: GroupPaths,
		Doc:   "Directory of file-mounted certificates (cert-chain.pem, key.pem, root-cert.pem) served when FILE_MOUNTED_CERTS=true.",
		Value: Path(func(c *Config) *string { return &c.FileMountedCertsDir }),
	},
	{
		Name: "MESHAGENT_CREDENTIAL_UDS_SOCKET", Default: "./var/run/secrets/credential-uds/socket", Group: GroupPaths,
		Doc: "Where pilot-agent looks for an external SDS server's socket (credential-uds) and, when one is there, points Envoy's bootstrap at it for credentialName secrets. " +
			"meshagent writes no Envoy bootstrap and neither serves nor proxies that socket: when a socket is found there at start-up, the agent says so, and Envoy's bootstrap must name it itself.",
		Value:  Path(func(c *Config) *string { return &c.CredentialUDSSocket }),
		Unused: credentialUDSUnused,
	},
	{
		Name: "MESHAGENT_TOKEN_PATH", Flag: "token-path", Group: GroupPaths,
		DerivedDefault: "./var/run/secrets/tokens/istio-token; /var/run/secrets/kubernetes.io/serviceaccount/token for JWT_POLICY=first-party-jwt",
		Doc:            "Service-account token file, read afresh for every CA request.",
		Value:          Path(func(c *Config) *string { return &c.TokenPath }),
	},
}

package settings

import (
	"fmt"
	"io/fs"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/tlspolicy"
)

// CA providers (CA_PROVIDER).
const (
	ProviderIstio   = "Citadel"
	ProviderLinkerd = "Linkerd"
)

// Agent modes (MESHAGENT_MODE).
const (
	ModeSidecar = "sidecar"
	ModeNode    = "node"
)

// Credential fetchers (CREDENTIAL_FETCHER_TYPE).
const (
	FetcherJWT          = "JWT"
	FetcherTokenRequest = "TokenRequest"
)

// PILOT_CERT_PROVIDER values.
const (
	CertProviderIstiod     = "istiod"
	CertProviderKubernetes = "kubernetes"
	CertProviderCustom     = "custom"
	CertProviderNone       = "none"
)

// DefaultFileResourceDirs are the directories whose files file-cert: and
// file-root: resources may name by default (MESHAGENT_FILE_RESOURCE_DIRS):
// where Istio puts file-mounted certificates, workload credentials and roots,
// and the usual system CA directories (file-root: of a system bundle).
const DefaultFileResourceDirs = "./etc/certs,./var/run/secrets/workload-spiffe-credentials,./var/run/secrets/istio,./var/lib/istio/data,/etc/ssl/certs,/etc/pki/tls/certs,/etc/pki/ca-trust"

// FileResourceDirList is FileResourceDirs as a list.
func (c *Config) FileResourceDirList() []string {
	var out []string
	for _, d := range strings.Split(c.FileResourceDirs, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}

// SystemRoots is the CA_ROOT_CA / XDS_ROOT_CA value that means the system trust store.
const SystemRoots = "SYSTEM"

// Config is the resolved configuration: every setting after defaults,
// environment and flags, with derived defaults filled in. Build it with
// Resolve; the rest of the agent reads it and never changes it.
type Config struct {
	// CAAddr is the CA's host:port (CA_ADDR).
	CAAddr string
	// CAProvider is ProviderIstio or ProviderLinkerd (CA_PROVIDER).
	CAProvider string
	// CARoot is the CA root bundle path, or SystemRoots (CA_ROOT_CA, derived as docs/operations.md says).
	CARoot string
	// XDSRoot is the xDS root bundle path, or SystemRoots (XDS_ROOT_CA, derived as docs/operations.md says).
	XDSRoot string
	// PilotCertProvider names who signs istiod's serving certificate; it
	// chooses the default CA root (PILOT_CERT_PROVIDER).
	PilotCertProvider string
	// IstiodSAN is the name the CA's and control plane's certificates must carry;
	// empty means the host part of the address dialled (ISTIOD_SAN).
	IstiodSAN string
	// CAHeaders is extra gRPC metadata for the CA (CA_HEADER_<NAME>).
	CAHeaders map[string]string
	// XDSHeaders is extra gRPC metadata for the control plane (XDS_HEADER_<NAME>).
	XDSHeaders map[string]string
	// TrustDomain of the workload identity (TRUST_DOMAIN).
	TrustDomain string
	// PodName, PodNamespace and ServiceAccount name the workload (POD_NAME,
	// POD_NAMESPACE, SERVICE_ACCOUNT). In dev mode empty namespace and service
	// account become "default".
	PodName, PodNamespace, ServiceAccount string
	// InstanceIP is the workload's IP address, the second field of the node
	// ID (INSTANCE_IP, derived from the host's addresses).
	InstanceIP string
	// ClusterID is sent to the CA and control plane as ClusterID metadata (ISTIO_META_CLUSTER_ID).
	ClusterID string
	// CertSigner is sent in the CSR request metadata as CertSigner (ISTIO_META_CERT_SIGNER).
	CertSigner string
	// JWTPolicy is third-party-jwt or first-party-jwt (JWT_POLICY).
	JWTPolicy string
	// CredentialFetcherType is where tokens come from (CREDENTIAL_FETCHER_TYPE).
	CredentialFetcherType string
	// CredentialIdentityProvider is the audience of TokenRequest tokens
	// (CREDENTIAL_IDENTITY_PROVIDER; derived from CA_PROVIDER).
	CredentialIdentityProvider string
	// PodUID is the pod's UID; TokenRequest tokens are bound to it (POD_UID).
	PodUID string
	// Kubeconfig lists kubeconfig files; empty means in-cluster (KUBECONFIG).
	Kubeconfig string
	// TokenLifetime is asked for TokenRequest tokens (MESHAGENT_TOKEN_LIFETIME).
	TokenLifetime time.Duration
	// TokenRefreshRatio is the share of a TokenRequest token's life after
	// which it is replaced (MESHAGENT_TOKEN_REFRESH_RATIO).
	TokenRefreshRatio float64
	// ProvCert is a directory with a provisioning certificate used as client
	// certificate towards the CA (PROV_CERT).
	ProvCert string
	// OutputCerts is the directory certificates are written to; empty: none (OUTPUT_CERTS).
	OutputCerts string
	// FileMountedCerts serves FileMountedCertsDir instead of asking a CA (FILE_MOUNTED_CERTS).
	FileMountedCerts bool
	// SecretTTL is the certificate lifetime asked of the CA (SECRET_TTL).
	SecretTTL time.Duration
	// GraceRatio is the share of a certificate's life left when it is renewed
	// (SECRET_GRACE_PERIOD_RATIO; 0.3 for Linkerd unless set).
	GraceRatio float64
	// GraceJitter is the ± jitter added to GraceRatio (SECRET_GRACE_PERIOD_RATIO_JITTER).
	GraceJitter float64
	// FileDebounce is how long file changes must settle before a reload (FILE_DEBOUNCE_DURATION).
	FileDebounce time.Duration
	// WorkloadRSAKeySize (WORKLOAD_RSA_KEY_SIZE); it selects an RSA key only when set.
	WorkloadRSAKeySize int
	// ECCSignatureAlgorithm (ECC_SIGNATURE_ALGORITHM); ECDSA selects an EC key of ECCCurve.
	ECCSignatureAlgorithm string
	// ECCCurve is P256 or P384 (ECC_CURVE).
	ECCCurve string
	// GRPCXDSBootstrap is where the gRPC xDS bootstrap is written (GRPC_XDS_BOOTSTRAP).
	GRPCXDSBootstrap string
	// DisableEnvoy (DISABLE_ENVOY): no Envoy runs beside the agent.
	DisableEnvoy bool
	// DiscoveryAddress is the control plane's host:port (PROXY_CONFIG discoveryAddress).
	DiscoveryAddress string
	// StatusPort is the status server's port (STATUS_PORT, else PROXY_CONFIG statusPort).
	StatusPort int
	// TerminationDrainDuration is how long a sidecar keeps serving after
	// SIGTERM (PROXY_CONFIG terminationDrainDuration, default 5s).
	TerminationDrainDuration time.Duration
	// WorkloadIdentitySocketFile is the SDS socket's file name (WORKLOAD_IDENTITY_SOCKET_FILE).
	WorkloadIdentitySocketFile string

	// KeyType is the workload key type (MESHAGENT_KEY_TYPE, or derived from
	// ECC_SIGNATURE_ALGORITHM / WORKLOAD_RSA_KEY_SIZE when those are set).
	KeyType pki.KeyType
	// LinkerdNamespace is the Linkerd control-plane namespace (MESHAGENT_LINKERD_NAMESPACE).
	LinkerdNamespace string
	// LinkerdIdentityServiceName is the TLS name the Linkerd identity service
	// must present (MESHAGENT_LINKERD_IDENTITY_SERVICE_NAME).
	LinkerdIdentityServiceName string
	// SDSSocket is the SDS Unix socket path (MESHAGENT_SDS_SOCKET).
	SDSSocket string
	// SocketHandoff is the socket holder's private socket
	// (MESHAGENT_SOCKET_HANDOFF); empty: no holder.
	SocketHandoff string
	// XDSSocket is the xDS proxy's Unix socket path (MESHAGENT_XDS_SOCKET).
	XDSSocket string
	// WorkloadCredentialsDir holds pre-provisioned credentials (MESHAGENT_WORKLOAD_CREDENTIALS_DIR).
	WorkloadCredentialsDir string
	// FileMountedCertsDir holds file-mounted certificates (MESHAGENT_FILE_MOUNTED_CERTS_DIR).
	FileMountedCertsDir string
	// TokenPath is the JWT token file (MESHAGENT_TOKEN_PATH, derived from JWT_POLICY).
	TokenPath string
	// StatusHost is the status server's listen host; empty means every interface (MESHAGENT_STATUS_HOST).
	StatusHost string
	// LogLevel is debug, info, warn or error (MESHAGENT_LOG_LEVEL).
	LogLevel string
	// Dev runs an in-process CA with a fresh in-memory root (MESHAGENT_DEV).
	Dev bool
	// CAMaxConcurrentCSRs bounds the CA requests in flight across identities
	// (MESHAGENT_CA_MAX_CONCURRENT_CSRS).
	CAMaxConcurrentCSRs int
	// IdentityIdleGrace is how long an identity nobody holds is kept
	// (MESHAGENT_IDENTITY_IDLE_GRACE).
	IdentityIdleGrace time.Duration
	// SDSMaxStreams bounds the SDS streams open at once (MESHAGENT_SDS_MAX_STREAMS).
	SDSMaxStreams int
	// SDSMaxStreamsPerPod bounds the SDS streams of one pod in node mode
	// (MESHAGENT_SDS_MAX_STREAMS_PER_POD).
	SDSMaxStreamsPerPod int
	// SDSMaxFileResourcesPerCaller bounds the file resources one caller's
	// SDS streams hold at once (MESHAGENT_SDS_MAX_FILE_RESOURCES_PER_CALLER).
	SDSMaxFileResourcesPerCaller int
	// SDSMaxRecvBytes bounds one SDS request's size (MESHAGENT_SDS_MAX_RECV_BYTES).
	SDSMaxRecvBytes int
	// SDSAllowedUIDs are the only peer uids the SDS socket serves; empty
	// serves anyone (MESHAGENT_SDS_ALLOWED_UIDS).
	SDSAllowedUIDs []uint32
	// FileResourceDirs are the directories whose files file-cert: and
	// file-root: may name, comma-separated, unless SDSAllowedUIDs limits the
	// socket's callers (MESHAGENT_FILE_RESOURCE_DIRS).
	FileResourceDirs string
	// XDSProxy runs the xDS proxy (MESHAGENT_XDS_PROXY; default true, false in dev mode).
	XDSProxy bool
	// Mode is ModeSidecar or ModeNode (MESHAGENT_MODE).
	Mode string
	// NodeName is the node the agent runs on, in node mode (NODE_NAME).
	NodeName string
	// NodeUIDIdentities are node processes' identities by uid
	// (MESHAGENT_NODE_UID_IDENTITIES); empty: none.
	NodeUIDIdentities map[uint32]pki.Identity
	// NodeCgroupRoot is where the kubelet makes pod cgroups, comma-separated
	// absolute paths; "" means learned from the agent's own pod, else the
	// top-level kubepods and kubepods.slice (MESHAGENT_NODE_CGROUP_ROOT).
	NodeCgroupRoot string
	// NodePodTokensDir is where the CSI driver hands the pods' Linkerd
	// tokens over, in node mode (MESHAGENT_NODE_POD_TOKENS_DIR).
	NodePodTokensDir string
	// NodePrefetchAll fetches certificates ahead for every pod of the node,
	// not only for pods that ask for it (MESHAGENT_NODE_PREFETCH_ALL).
	NodePrefetchAll bool
	// NodeFileResources serves file-cert: and file-root: resources in node
	// mode (MESHAGENT_NODE_FILE_RESOURCES; any pod can then read the files).
	NodeFileResources bool
	// PodCertificateSigner is the signer name of the PodCertificateRequests
	// the node agent signs; empty: none (MESHAGENT_POD_CERTIFICATE_SIGNER).
	PodCertificateSigner string
	// BrokerSocket is the SPIFFE Broker API's Unix socket, node mode only;
	// "" serves none (MESHAGENT_BROKER_SOCKET).
	BrokerSocket string
	// Brokers are the brokers allowed on it (MESHAGENT_BROKERS).
	Brokers []Broker
	// BrokerMaxStreams bounds one broker's open streams
	// (MESHAGENT_BROKER_MAX_STREAMS).
	BrokerMaxStreams int
	// BrokerMaxWorkloads bounds the workloads one broker holds streams for
	// (MESHAGENT_BROKER_MAX_WORKLOADS).
	BrokerMaxWorkloads int
	// WorkloadAPI serves the SPIFFE Workload API on the SDS socket (MESHAGENT_WORKLOAD_API).
	WorkloadAPI bool
	// WorkloadAPIMaxStreams bounds the Workload API streams open at once
	// (MESHAGENT_WORKLOAD_API_MAX_STREAMS).
	WorkloadAPIMaxStreams int
	// SocketMaxConnsPerCaller bounds one caller's connections to the SDS
	// socket (MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER).
	SocketMaxConnsPerCaller int
	// SocketMaxConnRatePerCaller bounds one caller's new connections a
	// second (MESHAGENT_SOCKET_MAX_CONNECTION_RATE_PER_CALLER).
	SocketMaxConnRatePerCaller int
	// SocketMaxStreamsPerConn bounds the RPCs open on one connection
	// (MESHAGENT_SOCKET_MAX_STREAMS_PER_CONNECTION).
	SocketMaxStreamsPerConn int
	// SocketMaxUnaryPerCaller bounds one caller's unary calls served at once
	// (MESHAGENT_SOCKET_MAX_UNARY_PER_CALLER).
	SocketMaxUnaryPerCaller int
	// SocketMaxQueuedBytesPerCaller bounds the response bytes queued for one
	// caller (MESHAGENT_SOCKET_MAX_QUEUED_BYTES_PER_CALLER).
	SocketMaxQueuedBytesPerCaller int
	// SocketIdleTimeout closes a connection without an RPC for that long
	// (MESHAGENT_SOCKET_IDLE_TIMEOUT).
	SocketIdleTimeout time.Duration

	// Trust bundle sources merged with the root files (docs/trust.md).
	// TrustConfigMap is the ConfigMap key read (MESHAGENT_TRUST_CONFIGMAP).
	TrustConfigMap ConfigMapRef
	// TrustBundleSigner names the signer whose ClusterTrustBundles are read
	// (MESHAGENT_TRUST_BUNDLE_SIGNER).
	TrustBundleSigner string
	// CRLFile is the CRL served in ROOTCA; empty: none (MESHAGENT_CRL_FILE).
	CRLFile string
	// OUTPUT_CERTS files and reload hooks (MESHAGENT_OUTPUT_CERTS_*).
	OutputKeyMode, OutputCertMode fs.FileMode
	OutputGroup                   string
	OutputBundleFile              string
	ReloadCommand                 string
	ReloadTimeout                 time.Duration
	ReloadPIDFile                 string
	ReloadProcess                 string
	ReloadSignal                  string
	// SPIFFEBundleMap writes OUTPUT_CERTS' SPIFFE trust bundle map and names
	// it in the gRPC bootstrap (MESHAGENT_SPIFFE_BUNDLE_MAP).
	SPIFFEBundleMap bool
	// The rest of pilot-agent's certificate and xDS-proxy settings
	// (docs/configuration.md says what each does here).
	PKCS8Key, XDSAuthPlaintext, ProxyConfigXDSAgent, MultiRootMesh bool
	XDSAuthProvider, CredentialUDSSocket                           string

	scheme          pki.Scheme // of CA_PROVIDER, TRUST_DOMAIN and MESHAGENT_LINKERD_NAMESPACE
	proxyStatusPort int        // statusPort from PROXY_CONFIG; 0 when not given
	proxyDrainSet   bool       // PROXY_CONFIG gives terminationDrainDuration
	rows            []Row
	// CompliancePolicy restricts the TLS of the CA and xDS connections
	// (COMPLIANCE_POLICY).
	CompliancePolicy tlspolicy.Policy

	// unknown are the names in the environment no setting knows (Unknown).
	unknown []Warning
}

// StatusAddr is the status server's listen address.
func (c *Config) StatusAddr() string {
	return net.JoinHostPort(c.StatusHost, strconv.Itoa(c.StatusPort))
}

// Scheme is the identity scheme of CA_PROVIDER: Istio's SPIFFE IDs, or for
// CA_PROVIDER=Linkerd Linkerd's DNS-like names, under TRUST_DOMAIN.
func (c *Config) Scheme() pki.Scheme { return c.scheme }

// Identity is the workload identity of POD_NAMESPACE and SERVICE_ACCOUNT in
// the scheme. It fails when the namespace or the service account
// is not set or cannot name an identity.
func (c *Config) Identity() (pki.Identity, error) {
	if c.PodNamespace == "" {
		return pki.Identity{}, fmt.Errorf("POD_NAMESPACE is not set: it names the workload identity; set POD_NAMESPACE and SERVICE_ACCOUNT, or try the agent with --dev (MESHAGENT_DEV=true)")
	}
	if c.ServiceAccount == "" {
		return pki.Identity{}, fmt.Errorf("SERVICE_ACCOUNT is not set: it names the workload identity; set SERVICE_ACCOUNT")
	}
	id, err := c.scheme.Identity(c.PodNamespace, c.ServiceAccount)
	if err != nil {
		return pki.Identity{}, fmt.Errorf("workload identity: %w", err)
	}
	return id, nil
}

// Warning is a setting whose value the agent accepts but does not act on.
type Warning struct {
	// Name is the environment variable.
	Name string
	// Value is its resolved value.
	Value string
	// Why says why the value has no effect.
	Why string
}

func (w Warning) String() string {
	return w.Name + "=" + strconv.Quote(w.Value) + " has no effect: " + w.Why
}

// Warnings lists the settings whose value has no effect (Setting.Unused),
// in registry order; the agent logs them at start-up.
func (c *Config) Warnings() []Warning {
	var out []Warning
	for i := range Registry {
		s := &Registry[i]
		if s.Unused == nil {
			continue
		}
		set := c.rows[i].Source != SourceDefault
		if why := s.Unused(c, set); why != "" {
			out = append(out, Warning{Name: s.Name, Value: c.rows[i].Value, Why: why})
		}
	}
	return out
}

// Table returns every setting with its resolved value, where the value came
// from and its doc string, in registry order (for `meshagent config`).
func (c *Config) Table() []Row { return append([]Row(nil), c.rows...) }

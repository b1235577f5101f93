// Package logkeys is the one table of log field names: every package logs
// with these keys, so that one name means one thing across the agent's
// logs (as SPIRE's telemetry names). Keys are snake_case. A new key is
// added here, never declared in a package of its own.
package logkeys

// Log field keys, in alphabetical order of their names.
const (
	// Addr is an address the agent listens on.
	Addr        = "addr"
	AllowedUIDs = "allowed_uids"
	Attempt     = "attempt"
	Audience    = "audience"
	Audiences   = "audiences"
	Backdate    = "backdate"
	Backoff     = "backoff"
	// Broker is the SPIFFE ID of a SPIFFE Broker API client.
	Broker  = "broker"
	Brokers = "brokers"
	Bundle  = "bundle"
	Bundles = "bundles"
	Bytes   = "bytes"
	// CAAddr is the CA address dialled.
	CAAddr = "ca_addr"
	// Caller is the caller of a local socket, as resolved: its pod, else its identity.
	Caller = "caller"
	Certs  = "certs"
	// CgroupMemoryLimit is the memory limit of the agent's cgroup, in bytes.
	CgroupMemoryLimit = "cgroup_memory_limit"
	CgroupRoot        = "cgroup_root"
	CgroupRootFrom    = "cgroup_root_from"
	Code              = "code"
	// CompliancePolicy is the TLS compliance policy (COMPLIANCE_POLICY).
	CompliancePolicy = "compliance_policy"
	Component        = "component"
	Condition        = "condition"
	Connections      = "connections"
	// Cred is the kernel credentials of a local socket's caller (uid, gid, pid).
	Cred = "cred"
	// CryptoModule names the Go cryptographic module and its FIPS mode.
	CryptoModule = "crypto_module"
	Dir          = "dir"
	// Drain is how long the agent keeps serving after a stop signal.
	Drain    = "drain"
	Endpoint = "endpoint"
	// Error is the error text a refused client was sent (zap.Error logs errors).
	Error       = "error"
	ErrorDetail = "error_detail"
	Expected    = "expected"
	Expiry      = "expiry"
	Failures    = "failures"
	File        = "file"
	Files       = "files"
	// Found is what was found where something else was expected.
	Found = "found"
	GID   = "gid"
	// Identity is a workload identity (SPIFFE ID or Linkerd DNS name).
	Identity              = "identity"
	Impersonated          = "impersonated"
	Latency               = "latency"
	Lifetime              = "lifetime"
	Limit                 = "limit"
	Lists                 = "lists"
	MaxConnections        = "max_connections"
	MaxFileNamesPerCaller = "max_file_names_per_caller"
	MaxQueuedBytes        = "max_queued_bytes"
	MaxRecvBytes          = "max_recv_bytes"
	MaxUnary              = "max_unary"
	Message               = "message"
	Method                = "method"
	// Mode is sidecar or node (MESHAGENT_MODE).
	Mode              = "mode"
	Name              = "name"
	Names             = "names"
	Node              = "node"
	NodeUIDIdentities = "node_uid_identities"
	Nonce             = "nonce"
	NotAfter          = "not_after"
	Path              = "path"
	// SoftMemoryLimit is the Go runtime's soft memory limit, in bytes.
	SoftMemoryLimit = "soft_memory_limit"
	Paths           = "paths"
	PID             = "pid"
	Pod             = "pod"
	// PodUID is a pod's UID.
	PodUID       = "pod_uid"
	PollInterval = "poll_interval"
	Protocol     = "protocol"
	// Reason is why something happened, short and stable.
	Reason = "reason"
	// Reasons counts the reasons of repeated refusals ("rate=3,limit=1").
	Reasons = "reasons"
	// RefreshAt is when a credential or certificate is refreshed.
	RefreshAt = "refresh_at"
	// Refused is how many connections were refused.
	// Reference is a SPIFFE Broker API workload reference, as the broker sent it.
	Reference          = "reference"
	Refused            = "refused"
	RegistrationSocket = "registration_socket"
	RemoteAddr         = "remote_addr"
	RenewAt            = "renew_at"
	Request            = "request"
	Requests           = "requests"
	Resolver           = "resolver"
	Resource           = "resource"
	RetryIn            = "retry_in"
	RootSerial         = "root_serial"
	Roots              = "roots"
	Serial             = "serial"
	ServerName         = "server_name"
	ServiceAccount     = "service_account"
	Services           = "services"
	Setting            = "setting"
	// Signal is the name of a signal the process received ("terminated").
	Signal = "signal"
	Signer = "signer"
	Socket = "socket"
	// Source names where certificates or roots come from: a certificate
	// source (ca, dev-ca, file, output-certs, the source chosen at start-up),
	// a trust source or a watched file source, by its name. A file the
	// agent reads is logged as a Path.
	Source  = "source"
	Sources = "sources"
	// Stream is the number of a stream, per server.
	Stream     = "stream"
	TTL        = "ttl"
	TargetPath = "target_path"
	TypeURL    = "type_url"
	UID        = "uid"
	Upstream   = "upstream"
	ValidUntil = "valid_until"
	Value      = "value"
	Version    = "version"
	VolumeID   = "volume_id"
	Workers    = "workers"
	// Suppressed counts log lines left out since the last one written.
	Suppressed = "suppressed"
	// Within is the interval a count covers.
	Within = "within"
)

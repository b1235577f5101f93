package settings

import "time"

// The defaults of the settings that configure one component's bounds and
// timing. They are defined here only: the components have no defaults of
// their own for these fields (internal/app passes every value), so the
// registry, docs/configuration.md and the running agent cannot disagree.
const (
	// DefaultSecretTTL is SECRET_TTL: the certificate lifetime asked of the CA.
	DefaultSecretTTL = 24 * time.Hour
	// DefaultGraceRatio is SECRET_GRACE_PERIOD_RATIO: the share of a
	// certificate's life left at renewal (the Istio scheme's).
	DefaultGraceRatio = 0.5
	// DefaultGraceJitter is SECRET_GRACE_PERIOD_RATIO_JITTER.
	DefaultGraceJitter = 0.01
	// DefaultMaxConcurrentCSRs is MESHAGENT_CA_MAX_CONCURRENT_CSRS: the CSRs
	// in flight across identities and pod certificate requests.
	DefaultMaxConcurrentCSRs = 8
	// DefaultIdentityIdleGrace is MESHAGENT_IDENTITY_IDLE_GRACE: how long an
	// identity nobody uses is kept.
	DefaultIdentityIdleGrace = time.Minute

	// DefaultMaxStreams is MESHAGENT_SDS_MAX_STREAMS and
	// MESHAGENT_WORKLOAD_API_MAX_STREAMS in sidecar mode (NodeMaxStreams in
	// node mode).
	DefaultMaxStreams = 4096
	// DefaultMaxStreamsPerPod is MESHAGENT_SDS_MAX_STREAMS_PER_POD: the
	// streams one resolved caller holds across SDS and the Workload API.
	DefaultMaxStreamsPerPod = 64
	// DefaultMaxFileResourcesPerCaller is
	// MESHAGENT_SDS_MAX_FILE_RESOURCES_PER_CALLER: a quarter of the file
	// resources the agent holds at once (64), so three other callers
	// always find room.
	DefaultMaxFileResourcesPerCaller = 16
	// DefaultMaxRecvBytes is MESHAGENT_SDS_MAX_RECV_BYTES: the size of one
	// message received on the local socket.
	DefaultMaxRecvBytes = 64 << 10

	// The local socket's per-caller limits (MESHAGENT_SOCKET_*).
	DefaultSocketMaxConnsPerCaller       = 32
	DefaultSocketMaxConnRatePerCaller    = 20
	DefaultSocketMaxStreamsPerConn       = 100
	DefaultSocketMaxUnaryPerCaller       = 16
	DefaultSocketMaxQueuedBytesPerCaller = 4 << 20
	DefaultSocketIdleTimeout             = 5 * time.Minute
)

package istio

// Log field keys.
const (
	keyAddr     = "ca_addr"
	keyIdentity = "identity"
	keyAttempt  = "attempt"
	keyCode     = "code"
	keyBackoff  = "backoff"
	keyLatency  = "latency"
	keyCerts    = "certs"
	keyTTL      = "ttl"
)

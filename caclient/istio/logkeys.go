package istio

// Log field keys.
const (
	keyAddr         = "ca_addr"
	keyIdentity     = "identity"
	keyCode         = "code"
	keyLatency      = "latency"
	keyCerts        = "certs"
	keyTTL          = "ttl"
	keyImpersonated = "impersonated"
)

package linkerd

// Log field keys.
const (
	keyAddr       = "ca_addr"
	keyServerName = "server_name"
	keyIdentity   = "identity"
	keyCode       = "code"
	keyLatency    = "latency"
	keyNotAfter   = "not_after"
	keyValidUntil = "valid_until"
	keyCerts      = "certs"
)

package workloadapi

// Log field keys used by the Workload API server.
const (
	keyMethod = "method"
	keyCaller = "caller"
	keyStream = "stream"
	keyReason = "reason"
	keyCode   = "code"
)

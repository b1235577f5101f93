package certfile

// Log field keys.
const (
	keySource   = "source"
	keyReason   = "reason"
	keyNotAfter = "not_after"
)

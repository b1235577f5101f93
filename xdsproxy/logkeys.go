package xdsproxy

// Log field keys.
const (
	keySocket   = "socket"
	keyUpstream = "upstream"
	keyStream   = "stream_id"
	keyProtocol = "protocol"
	keyAttempt  = "attempt"
	keyBackoff  = "backoff"
	keyCode     = "code"
	keyBytes    = "bytes"
	keyRequests = "requests"
	keyTypeURL  = "type_url"
	keyVersion  = "version"
)

package sds

// Log field keys used by the SDS server.
const (
	keySocket       = "socket"
	keyStream       = "stream"
	keyNames        = "names"
	keyName         = "name"
	keyNonce        = "nonce"
	keyVersion      = "version"
	keyCode         = "code"
	keyErrorDetail  = "error_detail"
	keyTypeURL      = "type_url"
	keyReason       = "reason"
	keyUID          = "uid"
	keyGID          = "gid"
	keyPID          = "pid"
	keyMaxStreams   = "max_streams"
	keyMaxRecvBytes = "max_recv_bytes"
	keyAllowedUIDs  = "allowed_uids"
)

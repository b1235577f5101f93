package sds

// Log field keys used by the SDS server.
const (
	keyStream      = "stream"
	keyNames       = "names"
	keyName        = "name"
	keyNonce       = "nonce"
	keyVersion     = "version"
	keyCode        = "code"
	keyErrorDetail = "error_detail"
	keyTypeURL     = "type_url"
	keyReason      = "reason"
	keyMaxFiles    = "max_file_names_per_caller"
	keyCaller      = "caller"
)

package udsserver

// Log field keys used by the socket server.
const (
	keySocket       = "socket"
	keyServices     = "services"
	keyMethod       = "method"
	keyUID          = "uid"
	keyGID          = "gid"
	keyPID          = "pid"
	keyMaxRecvBytes = "max_recv_bytes"
	keyAllowedUIDs  = "allowed_uids"
	keyResolver     = "resolver"
)

// Log field keys of the per-caller limits.
const (
	keyCred        = "cred"
	keyCaller      = "caller"
	keyMaxConns    = "max_connections"
	keyMaxUnary    = "max_unary"
	keyMaxQueued   = "max_queued_bytes"
	keyReason      = "reason"
	keyConnections = "connections"
	keyError       = "error"
	keyRefused     = "refused"
	keyReasons     = "reasons"
	keyWithin      = "within"
)

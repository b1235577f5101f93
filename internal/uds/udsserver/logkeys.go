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

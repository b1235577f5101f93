package status

// Log field keys.
const (
	keyAddr   = "addr"
	keyRemote = "remote_addr"
	keyPath   = "path"
)

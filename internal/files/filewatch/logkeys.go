package filewatch

// Log field keys.
const (
	keyDir          = "dir"
	keyPaths        = "paths"
	keyPollInterval = "poll_interval"
	keyReason       = "reason"
)

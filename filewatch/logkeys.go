package filewatch

// Log field keys.
const (
	keyDir   = "dir"
	keyEvent = "event"
	keyPaths = "paths"
)

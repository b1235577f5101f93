package outputcerts

// Log field keys.
const (
	keyDir   = "dir"
	keyFiles = "files"
	keyFile  = "file"
)

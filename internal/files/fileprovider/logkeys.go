package fileprovider

// Log field keys.
const (
	keyResource = "resource"
)

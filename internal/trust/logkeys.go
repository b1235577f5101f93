package trust

// Log field keys.
const (
	keySource  = "source"
	keySources = "sources"
	keyRoots   = "roots"
	keyReason  = "reason"
	keyBundles = "bundles"
	keyLists   = "lists"
)

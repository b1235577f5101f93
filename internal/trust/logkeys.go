package trust

// Log field keys.
const (
	keySource   = "source"
	keySources  = "sources"
	keyRoots    = "roots"
	keyReason   = "reason"
	keyObject   = "object"
	keySigner   = "signer"
	keyBundles  = "bundles"
)

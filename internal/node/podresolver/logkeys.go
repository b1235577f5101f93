package podresolver

// Log field keys used by the resolver.
const (
	keyCred     = "caller"
	keyReason   = "reason"
	keyIdentity = "identity"
	keyPod      = "pod"
)

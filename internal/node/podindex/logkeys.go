package podindex

// Log field keys used by the pod index.
const (
	keyNode     = "node"
	keyPod      = "pod"
	keyIdentity = "identity"
)

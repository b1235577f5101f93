package podcert

// Log field keys used by the signer.
const (
	keySigner    = "signer"
	keyNode      = "node"
	keyWorkers   = "workers"
	keyRequest   = "request"
	keyPod       = "pod"
	keyIdentity  = "identity"
	keyCondition = "condition"
	keyReason    = "reason"
	keyMessage   = "message"
	keyNotAfter  = "not_after"
	keyRefreshAt = "begin_refresh_at"
	keyAttempt   = "attempt"
	keyRetryIn   = "retry_in"
	keyBackdate  = "backdate"
	keyExpected  = "expected"
	keyBundle    = "bundle"
	keyRoots     = "roots"
)

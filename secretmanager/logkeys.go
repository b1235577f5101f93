package secretmanager

// Log field keys used by the secret manager.
const (
	keyName     = "name"
	keyIdentity = "identity"
	keySerial   = "serial"
	keyNotAfter = "not_after"
	keyRenewAt  = "renew_at"
	keyReason   = "reason"
	keyAttempt  = "attempt"
	keyRetryIn  = "retry_in"
	keySource   = "source"
	keyVersion  = "version"
	keyRoots    = "roots"
	keyLatency  = "latency"
)

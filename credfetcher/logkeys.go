package credfetcher

// Log field keys.
const (
	keyServiceAccount = "service_account"
	keyPod            = "pod"
	keyExpiry         = "expiry"
	keyRefreshAt      = "refresh_at"
	keyAudiences      = "audiences"
	keyFailures       = "failures"
	keyRetryIn        = "retry_in"
)

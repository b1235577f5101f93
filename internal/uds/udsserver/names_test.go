package udsserver

// The names the test servers give their limits, which their refusals
// must quote (internal/app gives the settings' names).
const (
	SettingMaxConnsPerCaller    = "TEST_MAX_CONNECTIONS_PER_CALLER"
	SettingMaxConnRatePerCaller = "TEST_MAX_CONNECTION_RATE_PER_CALLER"
	SettingMaxUnaryPerCaller    = "TEST_MAX_UNARY_PER_CALLER"
	SettingMaxQueuedPerCaller   = "TEST_MAX_QUEUED_BYTES_PER_CALLER"
)

var testLimitNames = LimitNames{
	ConnsPerCaller:    SettingMaxConnsPerCaller,
	ConnRatePerCaller: SettingMaxConnRatePerCaller,
	UnaryPerCaller:    SettingMaxUnaryPerCaller,
	QueuedPerCaller:   SettingMaxQueuedPerCaller,
}

package app

import (
	"fmt"
	"strings"
)

// A fieldSetting names the setting internal/app passes as a component's
// Config field.
type fieldSetting struct{ field, setting string }

// The settings behind the Config fields the components check.
var (
	managerSettings = []fieldSetting{
		{"Config.TTL", "SECRET_TTL"},
		{"Config.GraceRatio", "SECRET_GRACE_PERIOD_RATIO"},
		{"Config.GraceJitter", "SECRET_GRACE_PERIOD_RATIO_JITTER"},
		{"Config.MaxConcurrentCSRs", "MESHAGENT_CA_MAX_CONCURRENT_CSRS"},
		{"Config.IdleGrace", "MESHAGENT_IDENTITY_IDLE_GRACE"},
	}
	sdsSettings = []fieldSetting{
		{"Config.MaxStreams", "MESHAGENT_SDS_MAX_STREAMS"},
		{"Config.MaxStreamsPerCaller", "MESHAGENT_SDS_MAX_STREAMS_PER_POD"},
		{"Config.MaxFileNamesPerCaller", "MESHAGENT_SDS_MAX_FILE_RESOURCES_PER_CALLER"},
	}
	brokerSettings = []fieldSetting{
		{"Config.MaxStreams", "MESHAGENT_BROKER_MAX_STREAMS"},
		{"Config.MaxWorkloads", "MESHAGENT_BROKER_MAX_WORKLOADS"},
	}
	tokenSettings = []fieldSetting{
		{"Config.Lifetime", "MESHAGENT_TOKEN_LIFETIME"},
		{"Config.RefreshRatio", "MESHAGENT_TOKEN_REFRESH_RATIO"},
	}
	socketSettings = []fieldSetting{
		{"Config.MaxRecvBytes", "MESHAGENT_SDS_MAX_RECV_BYTES"},
		{"Config.MaxConnsPerCaller", "MESHAGENT_SOCKET_MAX_CONNECTIONS_PER_CALLER"},
		{"Config.MaxConnRatePerCaller", "MESHAGENT_SOCKET_MAX_CONNECTION_RATE_PER_CALLER"},
		{"Config.MaxStreamsPerConn", "MESHAGENT_SOCKET_MAX_STREAMS_PER_CONNECTION"},
		{"Config.MaxUnaryPerCaller", "MESHAGENT_SOCKET_MAX_UNARY_PER_CALLER"},
		{"Config.MaxQueuedBytesPerCaller", "MESHAGENT_SOCKET_MAX_QUEUED_BYTES_PER_CALLER"},
		{"Config.IdleTimeout", "MESHAGENT_SOCKET_IDLE_TIMEOUT"},
	}
	hookSettings = []fieldSetting{
		{"HookConfig.Timeout", "MESHAGENT_OUTPUT_CERTS_RELOAD_TIMEOUT"},
		{"HookConfig.Signal", "MESHAGENT_OUTPUT_CERTS_RELOAD_SIGNAL"},
	}
	outputSettings = []fieldSetting{
		{"Config.KeyMode", "MESHAGENT_OUTPUT_CERTS_KEY_MODE"},
		{"Config.CertMode", "MESHAGENT_OUTPUT_CERTS_CERT_MODE"},
	}
	fileSettings = []fieldSetting{
		{"SourceConfig.Debounce", "FILE_DEBOUNCE_DURATION"},
	}
	workloadAPISettings = []fieldSetting{
		{"Config.MaxStreams", "MESHAGENT_WORKLOAD_API_MAX_STREAMS"},
		{"Config.MaxStreamsPerCaller", "MESHAGENT_SDS_MAX_STREAMS_PER_POD"},
	}
)

// settingError maps a component's error about a Config field to the setting
// that gave the field its value: a ConfigError naming the setting first.
// An error that names no field of fields is returned as it is.
func settingError(err error, fields []fieldSetting) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, f := range fields {
		if strings.Contains(msg, f.field+" ") {
			return configError(fmt.Errorf("%s: %w", f.setting, err))
		}
	}
	return err
}

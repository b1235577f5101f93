package app

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/internal/settings"
)

// A component checks its Config and names the field; New names the setting
// that gave the field its value. The values here are ones Resolve refuses,
// set on a resolved configuration to reach the components' own checks.
func TestComponentErrorsNameTheSetting(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		setting string
		edit    func(*settings.Config)
	}{
		{"SECRET_TTL", func(c *settings.Config) { c.SecretTTL = 0 }},
		{"SECRET_GRACE_PERIOD_RATIO", func(c *settings.Config) { c.GraceRatio = 0 }},
		{"MESHAGENT_CA_MAX_CONCURRENT_CSRS", func(c *settings.Config) { c.CAMaxConcurrentCSRs = 0 }},
		{"MESHAGENT_IDENTITY_IDLE_GRACE", func(c *settings.Config) { c.IdentityIdleGrace = 0 }},
		{"MESHAGENT_SDS_MAX_STREAMS", func(c *settings.Config) { c.SDSMaxStreams = 0 }},
		{"MESHAGENT_SDS_MAX_FILE_RESOURCES_PER_CALLER", func(c *settings.Config) { c.SDSMaxFileResourcesPerCaller = 0 }},
		{"MESHAGENT_WORKLOAD_API_MAX_STREAMS", func(c *settings.Config) { c.WorkloadAPIMaxStreams = 0 }},
		{"MESHAGENT_SDS_MAX_RECV_BYTES", func(c *settings.Config) { c.SDSMaxRecvBytes = 0 }},
		{"MESHAGENT_SOCKET_IDLE_TIMEOUT", func(c *settings.Config) { c.SocketIdleTimeout = 0 }},
		{"FILE_DEBOUNCE_DURATION", func(c *settings.Config) { c.FileDebounce = 0 }},
		{"MESHAGENT_OUTPUT_CERTS_RELOAD_TIMEOUT", func(c *settings.Config) {
			c.OutputCerts, c.ReloadCommand, c.ReloadTimeout = filepath.Join(c.WorkloadCredentialsDir, "out"), "true", 0
		}},
		{"MESHAGENT_OUTPUT_CERTS_KEY_MODE", func(c *settings.Config) {
			c.OutputCerts, c.OutputKeyMode = filepath.Join(c.WorkloadCredentialsDir, "out"), 0
		}},
		{"MESHAGENT_OUTPUT_CERTS_CERT_MODE", func(c *settings.Config) {
			c.OutputCerts, c.OutputCertMode = filepath.Join(c.WorkloadCredentialsDir, "out"), 0
		}},
		{"MESHAGENT_OUTPUT_CERTS_RELOAD_SIGNAL", func(c *settings.Config) {
			c.OutputCerts, c.ReloadPIDFile, c.ReloadSignal = filepath.Join(c.WorkloadCredentialsDir, "out"), "/run/app.pid", ""
		}},
	} {
		t.Run(tt.setting, func(t *testing.T) {
			t.Parallel()
			s := sourceConfig(t, t.TempDir(), "MESHAGENT_DEV=true")
			tt.edit(s)
			_, err := New(Config{Settings: s})
			if err == nil || !errors.As(err, new(ConfigError)) || !strings.HasPrefix(err.Error(), tt.setting+": ") {
				t.Errorf("New = %v, want a ConfigError naming %s first", err, tt.setting)
			}
		})
	}
}

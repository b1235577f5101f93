package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// The trust publisher reads its settings through the registry: the
// environment sets what a flag does not, and a bad value is a configuration
// error (exit 2) naming the setting, as for run. Nothing here reaches the
// API server: every case fails before a client is made.
func TestTrustPublisherSettingsThroughTheRegistry(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tt := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no signer", nil, []string{"--roots=" + missing}, "MESHAGENT_POD_CERTIFICATE_SIGNER"},
		{"signer from the environment, checked", []string{"MESHAGENT_POD_CERTIFICATE_SIGNER=kubernetes.io/mine"}, []string{"--roots=" + missing}, "MESHAGENT_POD_CERTIFICATE_SIGNER=kubernetes.io/mine"},
		{"log level from the environment", []string{"MESHAGENT_LOG_LEVEL=loud"}, []string{"--signer=example.com/s", "--roots=" + missing}, "MESHAGENT_LOG_LEVEL"},
		{"log level flag", nil, []string{"--signer=example.com/s", "--roots=" + missing, "--log-level=loud"}, "--log-level"},
		{"roots from the environment", []string{"CA_ROOT_CA=" + missing}, []string{"--signer=example.com/s"}, missing},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runCmd(t, tt.env, append([]string{"trust-publisher"}, tt.args...)...)
			if code != exitConfig || !strings.Contains(stderr, tt.want) {
				t.Errorf("exit %d, stderr %q; want exit %d naming %q", code, stderr, exitConfig, tt.want)
			}
		})
	}
}

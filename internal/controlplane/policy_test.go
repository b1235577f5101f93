package controlplane

import (
	"crypto/tls"
	"testing"

	"github.com/meshagent/meshagent/internal/tlspolicy"
)

// TestTLSConfigAppliesThePolicy: the CA's and the xDS proxy's connections
// (both built from Config) carry COMPLIANCE_POLICY; the
// handshakes themselves are tested in internal/tlspolicy and, against the
// built agent, in test/silent_test.go.
func TestTLSConfigAppliesThePolicy(t *testing.T) {
	tc := Config{Addr: "ca:15012", Policy: tlspolicy.PQC}.TLSConfig()
	if tc.MinVersion != tls.VersionTLS13 || len(tc.CurvePreferences) != 1 || tc.CurvePreferences[0] != tls.X25519MLKEM768 {
		t.Errorf("pqc: min %x curves %v", tc.MinVersion, tc.CurvePreferences)
	}
	if tc := (Config{Addr: "ca:15012"}).TLSConfig(); tc.MinVersion != tls.VersionTLS12 || tc.MaxVersion != 0 || tc.CurvePreferences != nil {
		t.Errorf("no policy: min %x max %x curves %v", tc.MinVersion, tc.MaxVersion, tc.CurvePreferences)
	}
}

package tlspolicy

import (
	"crypto/fips140"
	"crypto/tls"
	"fmt"
	"slices"
)

// Policy is a COMPLIANCE_POLICY value.
type Policy string

// The policies pilot-agent knows (Istio pkg/features COMPLIANCE_POLICY).
const (
	// None leaves Go's defaults.
	None Policy = ""
	// FIPS1402: TLS 1.2 only, the four ECDHE AES-GCM suites, P-256.
	FIPS1402 Policy = "fips-140-2"
	// FIPS1403: TLS 1.2 and 1.3, the same suites (TLS 1.3: the AES-GCM
	// ones), P-256 and P-384; Go's FIPS 140-3 mode should be on (Check
	// says so when it is not).
	FIPS1403 Policy = "fips-140-3"
	// PQC: TLS 1.3 only, the post-quantum hybrid key exchange
	// X25519MLKEM768 alone.
	PQC Policy = "pqc"
)

// Policies lists the accepted non-empty values.
var Policies = []Policy{FIPS1402, FIPS1403, PQC}

// fipsSuites are the TLS 1.2 suites the FIPS policies allow. TLS 1.3
// suites cannot be chosen in Go (tls.Config.CipherSuites is ignored for
// them): in FIPS 140-3 mode Go offers only fipsSuitesTLS13; outside it,
// it offers ChaCha20-Poly1305 as well, and Apply refuses a connection on
// which the peer chose it.
var fipsSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
}

// fipsSuitesTLS13 are the TLS 1.3 suites FIPS 140-3 approves.
var fipsSuitesTLS13 = []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384}

// Apply restricts tc to what p allows. None (and an unknown policy, which
// settings refuse before this is called) leaves tc as it is.
func Apply(tc *tls.Config, p Policy) {
	switch p {
	case FIPS1402:
		tc.MinVersion, tc.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
		tc.CipherSuites = append([]uint16(nil), fipsSuites...)
		tc.CurvePreferences = []tls.CurveID{tls.CurveP256}
	case FIPS1403:
		tc.MinVersion, tc.MaxVersion = tls.VersionTLS12, tls.VersionTLS13
		tc.CipherSuites = append([]uint16(nil), fipsSuites...)
		tc.CurvePreferences = []tls.CurveID{tls.CurveP256, tls.CurveP384}
		if !fips140.Enabled() {
			refuseTLS13Suites(tc, fipsSuitesTLS13)
		}
	case PQC:
		tc.MinVersion, tc.MaxVersion = tls.VersionTLS13, tls.VersionTLS13
		tc.CurvePreferences = []tls.CurveID{tls.X25519MLKEM768}
	}
}

// refuseTLS13Suites makes tc fail a TLS 1.3 handshake whose suite is not
// one of allowed (before the client's Finished: nothing is sent on it),
// then runs tc's own VerifyConnection, if any.
func refuseTLS13Suites(tc *tls.Config, allowed []uint16) {
	next := tc.VerifyConnection
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		if cs.Version == tls.VersionTLS13 && !slices.Contains(allowed, cs.CipherSuite) {
			return fmt.Errorf("the fips-140-3 compliance policy allows the TLS 1.3 suites TLS_AES_128_GCM_SHA256 and TLS_AES_256_GCM_SHA384 alone; the peer chose %s (outside Go's FIPS 140-3 mode Go offers it too)",
				tls.CipherSuiteName(cs.CipherSuite))
		}
		if next != nil {
			return next(cs)
		}
		return nil
	}
}

// Check returns a warning when p asks for more than the binary gives: the
// FIPS 140-3 policy without Go's FIPS 140-3 mode on. "" when there is none.
func Check(p Policy) string {
	if p == FIPS1403 && !fips140.Enabled() {
		return "COMPLIANCE_POLICY=fips-140-3 without Go's FIPS 140-3 mode: TLS is restricted, but the cryptography is not the validated module's in FIPS mode; " +
			"run with GODEBUG=fips140=on (or only), and build with GOFIPS140=v1.0.0 (make build-fips)"
	}
	return ""
}

// Module names the crypto module in force: Go's FIPS 140-3 module version
// ("latest" when the binary was not built against a frozen module with
// GOFIPS140) and whether FIPS 140-3 mode is on, and enforced.
func Module() string {
	mode := "off"
	switch {
	case fips140.Enforced():
		mode = "only"
	case fips140.Enabled():
		mode = "on"
	}
	return fmt.Sprintf("Go Cryptographic Module %s, FIPS 140-3 mode %s", fips140.Version(), mode)
}

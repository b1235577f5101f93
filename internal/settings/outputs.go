package settings

import (
	"io/fs"
	"strconv"
)

// FileMode accepts an octal file mode ("0600", "640") among allowed.
func FileMode(field func(*Config) *fs.FileMode, allowed ...fs.FileMode) Value {
	accepted := "an octal mode, one of"
	for _, m := range allowed {
		accepted += " 0" + strconv.FormatUint(uint64(m), 8)
	}
	return Value{
		Type:     "octal file mode",
		Accepted: accepted,
		set: func(c *Config, raw string) error {
			n, err := strconv.ParseUint(raw, 8, 32)
			if err != nil {
				return reason("want " + accepted)
			}
			for _, m := range allowed {
				if fs.FileMode(n) == m {
					*field(c) = m
					return nil
				}
			}
			return reason("want " + accepted)
		},
		get: func(c *Config) string { return "0" + strconv.FormatUint(uint64(*field(c)), 8) },
	}
}

// certModes are the modes a certificate file may have: read by the owner
// at least, never written or executed by others.
var certModes = []fs.FileMode{0o644, 0o640, 0o600, 0o444, 0o440, 0o400}

// outputCertsOnly is the Unused check of a setting only OUTPUT_CERTS reads.
func outputCertsOnly(c *Config, set bool) string {
	if !set || c.OutputCerts != "" {
		return ""
	}
	return "only OUTPUT_CERTS uses it, and OUTPUT_CERTS is not set"
}

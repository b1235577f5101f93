package settings

import (
	"io/fs"
	"os"
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

// Refused accepts only the values ok allows; any other is refused with
// why, so a pilot-agent setting meshagent cannot honour stops the agent
// with one line instead of being ignored.
func Refused(field func(*Config) *bool, why string) Value {
	return Value{
		Type:     "bool",
		Accepted: "false (" + why + ")",
		set: func(c *Config, raw string) error {
			b, err := parseBool(raw)
			if err != nil {
				return err
			}
			if b {
				return reason("true is not supported: " + why)
			}
			*field(c) = false
			return nil
		},
		get: func(c *Config) string { return strconv.FormatBool(*field(c)) },
	}
}

// NoneSupported accepts only the empty value (unset): no value of the
// setting is supported, for the reason why.
func NoneSupported(field func(*Config) *string, why string) Value {
	return Value{
		Type:     "string",
		Accepted: "unset (" + why + ")",
		set: func(c *Config, raw string) error {
			if raw != "" {
				return reason("not supported: " + why)
			}
			*field(c) = ""
			return nil
		},
		get: func(c *Config) string { return *field(c) },
	}
}

// pkcs8Unused: keys are always PKCS#8 here; PKCS8_KEY=false set explicitly
// asks for pilot-agent's default (SEC 1 / PKCS#1 keys), which is not
// available.
func pkcs8Unused(c *Config, set bool) string {
	if !set || c.PKCS8Key {
		return ""
	}
	return "workload keys are always PKCS#8 (PRIVATE KEY) over SDS, the Workload API and in OUTPUT_CERTS"
}

// multiRootUnused: with ISTIO_MULTIROOT_MESH=true pilot-agent takes the
// mesh's extra roots from the ProxyConfig istiod sends over xDS; without
// PROXY_CONFIG_XDS_AGENT or a cluster trust source those roots are missing.
func multiRootUnused(c *Config, set bool) string {
	if !c.MultiRootMesh || c.ProxyConfigXDSAgent || !c.TrustConfigMap.IsZero() || c.TrustBundleSigner != "" {
		return ""
	}
	return "every root of every trust source is served (several roots per bundle, merged across sources), but the mesh's extra roots that pilot-agent takes from the ProxyConfig over xDS are read only with PROXY_CONFIG_XDS_AGENT=true: set it, or MESHAGENT_TRUST_CONFIGMAP or MESHAGENT_TRUST_BUNDLE_SIGNER (docs/trust.md)"
}

// proxyConfigXDSUnused: the ProxyConfig is asked for by the xDS proxy, which
// a node agent and MESHAGENT_XDS_PROXY=false do not run.
func proxyConfigXDSUnused(c *Config, _ bool) string {
	if !c.ProxyConfigXDSAgent || c.XDSProxy && c.Mode != ModeNode {
		return ""
	}
	return "the ProxyConfig is read by the xDS proxy, which does not run here (MESHAGENT_XDS_PROXY=false or node mode): its roots are not merged"
}

// credentialUDSUnused: pilot-agent points Envoy's bootstrap at an external
// SDS socket found at this path (its sds-grpc-cred cluster, for
// credentialName resources); meshagent writes no Envoy bootstrap.
func credentialUDSUnused(c *Config, _ bool) string {
	if c.CredentialUDSSocket == "" {
		return ""
	}
	fi, err := os.Stat(c.CredentialUDSSocket)
	if err != nil || fi.Mode()&fs.ModeSocket == 0 {
		return ""
	}
	return "a socket is there, for Envoy's credentialName secrets; meshagent neither serves nor proxies it and writes no Envoy bootstrap: Envoy's bootstrap must name it (pilot-agent's sds-grpc-cred cluster)"
}

package settings

import (
	"strings"
)

// ConfigMapRef names one key of one ConfigMap (MESHAGENT_TRUST_CONFIGMAP).
// The zero value names none.
type ConfigMapRef struct {
	Namespace, Name, Key string
}

// IsZero reports whether the reference names nothing.
func (r ConfigMapRef) IsZero() bool { return r == ConfigMapRef{} }

// String is <namespace>/<name>/<key>, or "" for the zero value.
func (r ConfigMapRef) String() string {
	if r.IsZero() {
		return ""
	}
	return r.Namespace + "/" + r.Name + "/" + r.Key
}

// DefaultTrustConfigMapKey is the key read when MESHAGENT_TRUST_CONFIGMAP
// names none: istiod's istio-ca-root-cert ConfigMap keeps the root there.
const DefaultTrustConfigMapKey = "root-cert.pem"

// ParseConfigMapRef parses <namespace>/<name>[/<key>]; the key defaults to
// DefaultTrustConfigMapKey. Empty text is the zero value.
func ParseConfigMapRef(raw string) (ConfigMapRef, error) {
	if raw == "" {
		return ConfigMapRef{}, nil
	}
	parts := strings.Split(raw, "/")
	if len(parts) < 2 || len(parts) > 3 {
		return ConfigMapRef{}, reason("want <namespace>/<name>[/<key>]")
	}
	r := ConfigMapRef{Namespace: parts[0], Name: parts[1], Key: DefaultTrustConfigMapKey}
	if len(parts) == 3 {
		r.Key = parts[2]
	}
	if !isDNSLabel(r.Namespace) {
		return ConfigMapRef{}, reason("want <namespace>/<name>[/<key>]: the namespace is a DNS label (lower-case letters, digits and '-', at most 63)")
	}
	if !isDNSSubdomain(r.Name) {
		return ConfigMapRef{}, reason("want <namespace>/<name>[/<key>]: the name is a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253)")
	}
	if !isConfigMapKey(r.Key) {
		return ConfigMapRef{}, reason("want <namespace>/<name>[/<key>]: the key has letters, digits, '-', '_' and '.', at most 253")
	}
	return r, nil
}

// ConfigMapKey is a ConfigMapRef setting.
func ConfigMapKey(field func(*Config) *ConfigMapRef) Value {
	return Value{
		Type:     "namespace/name[/key]",
		Accepted: "<namespace>/<name>[/<key>] of a ConfigMap (key default " + DefaultTrustConfigMapKey + "), or empty for none",
		set: func(c *Config, raw string) error {
			r, err := ParseConfigMapRef(raw)
			if err != nil {
				return err
			}
			*field(c) = r
			return nil
		},
		get: func(c *Config) string { return field(c).String() },
	}
}

// SignerName is a Kubernetes signer name, <domain>/<path> (as
// certificates.k8s.io spells them), or empty for none.
func SignerName(field func(*Config) *string) Value {
	return Value{
		Type:     "signer name",
		Accepted: "a signer name <domain>/<path> (e.g. clusterissuers.cert-manager.io/istio-ca), or empty for none",
		set: func(c *Config, raw string) error {
			if raw != "" {
				domain, path, ok := strings.Cut(raw, "/")
				if !ok || !isDNSSubdomain(domain) || path == "" || len(raw) > 571 || strings.ContainsFunc(path, func(r rune) bool {
					return r <= ' ' || r > '~' || r == ':'
				}) {
					return reason("want a signer name <domain>/<path> (e.g. clusterissuers.cert-manager.io/istio-ca)")
				}
			}
			*field(c) = raw
			return nil
		},
		get: func(c *Config) string { return *field(c) },
	}
}

func isDNSLabel(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

func isDNSSubdomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if !isDNSLabel(l) {
			return false
		}
	}
	return true
}

func isConfigMapKey(s string) bool {
	if s == "" || len(s) > 253 || s == "." || s == ".." {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

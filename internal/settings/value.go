package settings

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
)

// Value says how a setting's text is parsed, checked and stored in a Config,
// and how the stored value is shown again. Build one with the helpers below
// (String, Path, Bool, Duration, Float, Int, Enum, ...); each takes a function
// returning the address of the Config field it fills.
type Value struct {
	// Type names the value's type in docs/configuration.md.
	Type string
	// Accepted describes the accepted values; it ends the error line for a bad
	// value and is shown in the docs.
	Accepted string
	set      func(c *Config, raw string) error
	get      func(c *Config) string
	headers  func(c *Config) *map[string]string // prefix settings only
}

// reason is a parse failure; Resolve wraps it into an InvalidError that names
// the setting and the bad value.
type reason string

func (r reason) Error() string { return string(r) }

// String is free text.
func String(field func(*Config) *string) Value {
	return Value{
		Type:     "string",
		Accepted: "any text",
		set:      func(c *Config, raw string) error { *field(c) = raw; return nil },
		get:      func(c *Config) string { return *field(c) },
	}
}

// Path is a file or directory path, relative to the working directory unless
// absolute.
func Path(field func(*Config) *string) Value {
	return Value{
		Type:     "path",
		Accepted: "a file system path",
		set: func(c *Config, raw string) error {
			if err := checkPath(raw); err != nil {
				return err
			}
			*field(c) = raw
			return nil
		},
		get: func(c *Config) string { return *field(c) },
	}
}

// FileName is a single path element (no directory separators).
func FileName(field func(*Config) *string) Value {
	return Value{
		Type:     "file name",
		Accepted: "a file name without '/'",
		set: func(c *Config, raw string) error {
			if strings.ContainsAny(raw, "/\x00") || raw == "." || raw == ".." {
				return reason("want a file name without '/'")
			}
			*field(c) = raw
			return nil
		},
		get: func(c *Config) string { return *field(c) },
	}
}

// HostPort is a network address host:port.
func HostPort(field func(*Config) *string) Value {
	return Value{
		Type:     "host:port",
		Accepted: "host:port with a port from 1 to 65535",
		set: func(c *Config, raw string) error {
			if err := checkHostPort(raw); err != nil {
				return err
			}
			*field(c) = raw
			return nil
		},
		get: func(c *Config) string { return *field(c) },
	}
}

// Bool accepts true or false (and 1/0, t/f in any case, as strconv.ParseBool).
func Bool(field func(*Config) *bool) Value {
	return Value{
		Type:     "bool",
		Accepted: "true or false",
		set: func(c *Config, raw string) error {
			b, err := parseBool(raw)
			if err != nil {
				return err
			}
			*field(c) = b
			return nil
		},
		get: func(c *Config) string { return strconv.FormatBool(*field(c)) },
	}
}

// Duration accepts a Go duration ("90s", "24h", "1h30m") of at least min.
func Duration(field func(*Config) *time.Duration, minimum time.Duration) Value {
	return Value{
		Type:     "duration",
		Accepted: fmt.Sprintf("a duration such as 100ms, 90s or 24h, at least %s", minimum),
		set: func(c *Config, raw string) error {
			d, err := parseDuration(raw, minimum)
			if err != nil {
				return err
			}
			*field(c) = d
			return nil
		},
		get: func(c *Config) string { return field(c).String() },
	}
}

// Float accepts a decimal number in [minimum, maximum].
func Float(field func(*Config) *float64, minimum, maximum float64) Value {
	return Value{
		Type:     "number",
		Accepted: fmt.Sprintf("a number from %g to %g", minimum, maximum),
		set: func(c *Config, raw string) error {
			f, err := parseFloat(raw, minimum, maximum)
			if err != nil {
				return err
			}
			*field(c) = f
			return nil
		},
		get: func(c *Config) string { return strconv.FormatFloat(*field(c), 'g', -1, 64) },
	}
}

// GraceRatio accepts a number in (0, 1]: the share of a certificate's life
// left at renewal. 0 is refused rather than honoured: it would renew only
// once the certificate has expired, leaving the workload without one.
func GraceRatio(field func(*Config) *float64) Value {
	const accepted = "a number greater than 0 and at most 1 (0 would renew only after the certificate expired)"
	return Value{
		Type:     "number",
		Accepted: accepted,
		set: func(c *Config, raw string) error {
			f, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
			if err != nil || !(f > 0 && f <= 1) {
				return reason("want " + accepted)
			}
			*field(c) = f
			return nil
		},
		get: func(c *Config) string { return strconv.FormatFloat(*field(c), 'g', -1, 64) },
	}
}

// Int accepts a decimal integer in [minimum, maximum].
func Int(field func(*Config) *int, minimum, maximum int) Value {
	return Value{
		Type:     "integer",
		Accepted: fmt.Sprintf("an integer from %d to %d", minimum, maximum),
		set: func(c *Config, raw string) error {
			n, err := parseInt(raw, minimum, maximum)
			if err != nil {
				return err
			}
			*field(c) = n
			return nil
		},
		get: func(c *Config) string { return strconv.Itoa(*field(c)) },
	}
}

// UIDs accepts a comma-separated list of numeric user ids (empty: none).
func UIDs(field func(*Config) *[]uint32) Value {
	return Value{
		Type:     "uid list",
		Accepted: "comma-separated numeric uids from 0 to 4294967294, or empty",
		set: func(c *Config, raw string) error {
			var out []uint32
			for part := range strings.SplitSeq(raw, ",") {
				part = strings.TrimSpace(part)
				if part == "" {
					continue
				}
				n, err := strconv.ParseUint(part, 10, 32)
				if err != nil || n == 1<<32-1 {
					return reason("want comma-separated numeric uids from 0 to 4294967294")
				}
				out = append(out, uint32(n))
			}
			*field(c) = out
			return nil
		},
		get: func(c *Config) string {
			ids := *field(c)
			parts := make([]string, len(ids))
			for i, id := range ids {
				parts[i] = strconv.FormatUint(uint64(id), 10)
			}
			return strings.Join(parts, ",")
		},
	}
}

// IntChoice accepts one of the listed integers.
func IntChoice(field func(*Config) *int, choices ...int) Value {
	names := make([]string, len(choices))
	for i, n := range choices {
		names[i] = strconv.Itoa(n)
	}
	accepted := "one of " + strings.Join(names, ", ")
	return Value{
		Type:     "integer",
		Accepted: accepted,
		set: func(c *Config, raw string) error {
			n, err := strconv.Atoi(strings.TrimSpace(raw))
			if err != nil || !slices.Contains(choices, n) {
				return reason("accepted: " + accepted)
			}
			*field(c) = n
			return nil
		},
		get: func(c *Config) string { return strconv.Itoa(*field(c)) },
	}
}

// Enum accepts one of values, compared without regard to case, and stores the
// value as spelled in values.
func Enum[T ~string](field func(*Config) *T, values ...T) Value {
	names := make([]string, len(values))
	for i, v := range values {
		names[i] = string(v)
	}
	accepted := "one of " + strings.Join(names, ", ")
	return Value{
		Type:     "enum",
		Accepted: accepted,
		set: func(c *Config, raw string) error {
			v, err := parseEnum(raw, names)
			if err != nil {
				return err
			}
			*field(c) = T(v)
			return nil
		},
		get: func(c *Config) string { return string(*field(c)) },
	}
}

// KeyType accepts the workload key types of pki.KeyTypes.
func KeyType(field func(*Config) *pki.KeyType) Value {
	return Enum(field, pki.KeyTypes...)
}

// CARoot is a root bundle path or the word SYSTEM (the system trust store).
func CARoot(field func(*Config) *string) Value {
	v := Path(field)
	v.Type = "path or SYSTEM"
	v.Accepted = "a path to a PEM root bundle, or SYSTEM"
	return v
}

// JSON is a JSON document parsed by parse into the Config.
func JSON(parse func(c *Config, raw string) error, show func(c *Config) string) Value {
	return Value{Type: "JSON", Accepted: "a JSON object", set: parse, get: show}
}

// Headers collects every variable that starts with a Setting's Name (a prefix)
// into a map keyed by the rest of the variable's name.
func Headers(field func(*Config) *map[string]string) Value {
	return Value{
		Type:     "prefix",
		Accepted: "a header name of letters, digits, '-', '_' or '.' after the prefix, and a value of printable ASCII",
		headers:  field, // filled by Resolve from every variable with the prefix
		get: func(c *Config) string {
			m := *field(c)
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for i, k := range keys {
				keys[i] = k + "=<redacted>"
			}
			return strings.Join(keys, ",")
		},
	}
}

func parseBool(raw string) (bool, error) {
	b, err := strconv.ParseBool(strings.TrimSpace(raw))
	if err != nil {
		return false, reason("accepted: true or false")
	}
	return b, nil
}

func parseDuration(raw string, minimum time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(raw))
	if err != nil {
		return 0, reason("want a duration such as 100ms, 90s or 24h")
	}
	if d < minimum {
		return 0, reason(fmt.Sprintf("want at least %s", minimum))
	}
	return d, nil
}

func parseFloat(raw string, minimum, maximum float64) (float64, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
	if err != nil || f != f { // f != f: NaN
		return 0, reason(fmt.Sprintf("want a number from %g to %g", minimum, maximum))
	}
	if f < minimum || f > maximum {
		return 0, reason(fmt.Sprintf("want a number from %g to %g", minimum, maximum))
	}
	return f, nil
}

func parseInt(raw string, minimum, maximum int) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(raw))
	if err != nil || n < minimum || n > maximum {
		return 0, reason(fmt.Sprintf("want an integer from %d to %d", minimum, maximum))
	}
	return n, nil
}

func parseEnum(raw string, names []string) (string, error) {
	s := strings.TrimSpace(raw)
	for _, n := range names {
		if strings.EqualFold(s, n) {
			return n, nil
		}
	}
	return "", reason("accepted: " + strings.Join(names, ", "))
}

func checkPath(raw string) error {
	if strings.ContainsRune(raw, 0) {
		return reason("a path cannot contain a NUL byte")
	}
	return nil
}

func checkHostPort(raw string) error {
	host, port, err := net.SplitHostPort(raw)
	if err != nil || host == "" {
		return reason("want host:port, e.g. istiod.istio-system.svc:15012")
	}
	if strings.ContainsAny(host, " /\x00") {
		return reason("want host:port, e.g. istiod.istio-system.svc:15012")
	}
	if _, err := parseInt(port, 1, 65535); err != nil {
		return reason("want host:port with a port from 1 to 65535")
	}
	return nil
}

// checkHeaderName accepts the part of a CA_HEADER_/XDS_HEADER_ variable after
// the prefix: it becomes gRPC metadata, so it must be a valid header name.
func checkHeaderName(name string) error {
	if name == "" {
		return reason("the header name after the prefix is empty")
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
		default:
			return reason("a header name may hold only letters, digits, '-', '_' and '.'")
		}
	}
	if strings.HasPrefix(strings.ToLower(name), "grpc-") {
		return reason("header names starting with grpc- are reserved by gRPC")
	}
	return nil
}

func checkHeaderValue(v string) error {
	for _, r := range v {
		if r < 0x20 || r > 0x7e {
			return reason("a header value may hold only printable ASCII (no line breaks)")
		}
	}
	return nil
}

// TrustDomain is a SPIFFE trust domain name: lower-case letters, digits, '.', '-' and '_'.
func TrustDomain(field func(*Config) *string) Value {
	return Value{
		Type:     "trust domain",
		Accepted: "lower-case letters, digits, '.', '-' and '_'",
		set: func(c *Config, raw string) error {
			if err := checkTrustDomain(raw); err != nil {
				return err
			}
			*field(c) = raw
			return nil
		},
		get: func(c *Config) string { return *field(c) },
	}
}

// Label is a name that becomes part of an identity (a namespace, a service
// account): letters, digits, '.', '-' and '_'.
func Label(field func(*Config) *string) Value {
	return Value{
		Type:     "name",
		Accepted: "letters, digits, '.', '-' and '_'",
		set: func(c *Config, raw string) error {
			if err := checkLabel(raw); err != nil {
				return err
			}
			*field(c) = raw
			return nil
		},
		get: func(c *Config) string { return *field(c) },
	}
}

func checkTrustDomain(s string) error {
	if s == "" || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.Contains(s, "..") {
		return reason("want a trust domain of lower-case letters, digits, '.', '-' and '_'")
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
		default:
			return reason("want a trust domain of lower-case letters, digits, '.', '-' and '_'")
		}
	}
	return nil
}

func checkLabel(s string) error {
	if s == "" || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.Contains(s, "..") {
		return reason("want a name of letters, digits, '.', '-' and '_'")
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
		default:
			return reason("want a name of letters, digits, '.', '-' and '_'")
		}
	}
	return nil
}

// IP is an IPv4 or IPv6 address, stored in its canonical text form.
func IP(field func(*Config) *string) Value {
	return Value{
		Type:     "IP address",
		Accepted: "an IPv4 or IPv6 address",
		set: func(c *Config, raw string) error {
			ip := net.ParseIP(strings.TrimSpace(raw))
			if ip == nil {
				return reason("want an IPv4 or IPv6 address")
			}
			*field(c) = ip.String()
			return nil
		},
		get: func(c *Config) string { return *field(c) },
	}
}

package settings

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Defaults taken from PROXY_CONFIG when it does not say otherwise; the
// drain is Istio's (mesh.DefaultProxyConfig's terminationDrainDuration).
const (
	DefaultDiscoveryAddress         = "istiod.istio-system.svc:15012"
	DefaultStatusPort               = 15020
	DefaultTerminationDrainDuration = 5 * time.Second
)

// ProxyConfig is the part of Istio's ProxyConfig that meshagent reads.
type ProxyConfig struct {
	// DiscoveryAddress is the control plane's host:port; empty when not given.
	DiscoveryAddress string
	// StatusPort is the status server's port; 0 when not given.
	StatusPort int
	// TerminationDrainDuration is how long the agent keeps serving after
	// SIGTERM (docs/operations.md, "Termination"); nil when not given.
	TerminationDrainDuration *time.Duration
}

// proxyConfigJSON accepts both the proto JSON names (camelCase) and the
// original field names, as protojson does.
type proxyConfigJSON struct {
	DiscoveryAddress  *string   `json:"discoveryAddress"`
	DiscoveryAddress2 *string   `json:"discovery_address"`
	StatusPort        *intValue `json:"statusPort"`
	StatusPort2       *intValue `json:"status_port"`
	Drain             *string   `json:"terminationDrainDuration"`
	Drain2            *string   `json:"termination_drain_duration"`
}

// intValue is a JSON integer written as a number or, as proto JSON allows, a
// string.
type intValue int

func (v *intValue) UnmarshalJSON(b []byte) error {
	s := string(b)
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 32)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != float64(int32(f)) {
			return fmt.Errorf("%s is not an integer", b)
		}
		n = int64(f)
	}
	*v = intValue(n)
	return nil
}

// ParseProxyConfig reads discoveryAddress, statusPort and
// terminationDrainDuration from an Istio ProxyConfig JSON object. Unknown
// fields are ignored; anything that is not a JSON object, or a field of the
// wrong type or out of range, is an error.
func ParseProxyConfig(raw string) (ProxyConfig, error) {
	var pc ProxyConfig
	b := bytes.TrimSpace([]byte(raw))
	if len(b) == 0 || b[0] != '{' {
		return pc, errors.New("want a JSON object")
	}
	var j proxyConfigJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return pc, fmt.Errorf("not valid JSON: %s", oneLine(err.Error()))
	}
	addr := j.DiscoveryAddress
	if addr == nil {
		addr = j.DiscoveryAddress2
	}
	if addr != nil && *addr != "" {
		if err := checkHostPort(*addr); err != nil {
			return pc, fmt.Errorf("discoveryAddress %q: %w", *addr, err)
		}
		pc.DiscoveryAddress = *addr
	}
	port := j.StatusPort
	if port == nil {
		port = j.StatusPort2
	}
	if port != nil {
		if *port < 0 || *port > 65535 {
			return pc, fmt.Errorf("statusPort %d: want a port from 1 to 65535", *port)
		}
		pc.StatusPort = int(*port)
	}
	drain := j.Drain
	if drain == nil {
		drain = j.Drain2
	}
	if drain != nil {
		d, err := parseProtoDuration(*drain)
		if err != nil {
			return pc, fmt.Errorf("terminationDrainDuration %q: %w", *drain, err)
		}
		pc.TerminationDrainDuration = &d
	}
	return pc, nil
}

// protoDuration is a google.protobuf.Duration in proto JSON: seconds with
// up to nine decimals and an "s" ("5s", "0.5s").
var protoDuration = regexp.MustCompile(`^(\d+)(?:\.(\d{1,9}))?s$`)

// parseProtoDuration reads a non-negative proto JSON duration.
func parseProtoDuration(s string) (time.Duration, error) {
	m := protoDuration.FindStringSubmatch(s)
	if m == nil {
		return 0, errors.New(`want seconds such as "5s" or "0.5s" (a proto JSON duration, not negative)`)
	}
	secs, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || secs > math.MaxInt64/int64(time.Second)-1 {
		return 0, errors.New("too long")
	}
	nanos := int64(0)
	if m[2] != "" {
		frac := m[2] + strings.Repeat("0", 9-len(m[2]))
		nanos, _ = strconv.ParseInt(frac, 10, 64) // nine digits
	}
	return time.Duration(secs)*time.Second + time.Duration(nanos), nil
}

func setProxyConfig(c *Config, raw string) error {
	pc, err := ParseProxyConfig(raw)
	if err != nil {
		return reason(err.Error())
	}
	c.DiscoveryAddress = pc.DiscoveryAddress
	if c.DiscoveryAddress == "" {
		c.DiscoveryAddress = DefaultDiscoveryAddress
	}
	c.proxyStatusPort = pc.StatusPort
	c.TerminationDrainDuration = DefaultTerminationDrainDuration
	c.proxyDrainSet = pc.TerminationDrainDuration != nil
	if c.proxyDrainSet {
		c.TerminationDrainDuration = *pc.TerminationDrainDuration
	}
	return nil
}

func showProxyConfig(c *Config) string {
	port := c.proxyStatusPort
	if port == 0 {
		port = DefaultStatusPort
	}
	addr, _ := json.Marshal(c.DiscoveryAddress)
	return `{"discoveryAddress":` + string(addr) + `,"statusPort":` + strconv.Itoa(port) +
		`,"terminationDrainDuration":"` + strconv.FormatFloat(c.TerminationDrainDuration.Seconds(), 'f', -1, 64) + `s"}`
}

// proxyConfigUnused: terminationDrainDuration given where the agent does not
// drain (docs/operations.md, "Termination").
func proxyConfigUnused(c *Config, set bool) string {
	if !set || !c.proxyDrainSet || c.TerminationDrainDuration == 0 {
		return ""
	}
	switch {
	case c.Mode == ModeNode:
		return "terminationDrainDuration has no effect in node mode: the node agent stops at once on SIGTERM, and its pods keep the certificates they hold"
	case c.DisableEnvoy:
		return "terminationDrainDuration has no effect with DISABLE_ENVOY=true: as pilot-agent, the agent drains only beside an Envoy"
	}
	return ""
}

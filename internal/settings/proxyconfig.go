package settings

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Defaults taken from PROXY_CONFIG when it does not say otherwise.
const (
	DefaultDiscoveryAddress = "istiod.istio-system.svc:15012"
	DefaultStatusPort       = 15020
)

// ProxyConfig is the part of Istio's ProxyConfig that meshagent reads.
type ProxyConfig struct {
	// DiscoveryAddress is the control plane's host:port; empty when not given.
	DiscoveryAddress string
	// StatusPort is the status server's port; 0 when not given.
	StatusPort int
}

// proxyConfigJSON accepts both the proto JSON names (camelCase) and the
// original field names, as protojson does.
type proxyConfigJSON struct {
	DiscoveryAddress  *string   `json:"discoveryAddress"`
	DiscoveryAddress2 *string   `json:"discovery_address"`
	StatusPort        *intValue `json:"statusPort"`
	StatusPort2       *intValue `json:"status_port"`
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

// ParseProxyConfig reads discoveryAddress and statusPort from an Istio
// ProxyConfig JSON object. Unknown fields are ignored; anything that is not a
// JSON object, or a field of the wrong type or out of range, is an error.
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
	return pc, nil
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
	return nil
}

func showProxyConfig(c *Config) string {
	port := c.proxyStatusPort
	if port == 0 {
		port = DefaultStatusPort
	}
	addr, _ := json.Marshal(c.DiscoveryAddress)
	return `{"discoveryAddress":` + string(addr) + `,"statusPort":` + strconv.Itoa(port) + `}`
}

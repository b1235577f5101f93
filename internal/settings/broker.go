package settings

import (
	"strconv"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Reference types a broker may be allowed to use (MESHAGENT_BROKERS), in
// the order they are shown.
const (
	// BrokerRefPID is the SPIFFE Broker API's WorkloadPIDReference.
	BrokerRefPID = "pid"
	// BrokerRefPod is its KubernetesObjectReference to a pod.
	BrokerRefPod = "pod"
)

// Defaults of the broker limits: a node runs at most a few hundred pods, and
// a broker holds two streams per workload (SVIDs and bundles).
const (
	DefaultBrokerMaxStreams   = 1024
	DefaultBrokerMaxWorkloads = 512
)

// Broker is one broker allowed on the SPIFFE Broker API endpoint: its
// SPIFFE ID and the reference types it may use.
type Broker struct {
	// ID is the broker's SPIFFE ID, parsed.
	ID spiffeid.ID
	// PID and Pod say which reference types the broker may use.
	PID, Pod bool
}

// String is <spiffe id>=<types>, types in the order pid, pod.
func (b Broker) String() string {
	var types []string
	if b.PID {
		types = append(types, BrokerRefPID)
	}
	if b.Pod {
		types = append(types, BrokerRefPod)
	}
	return b.ID.String() + "=" + strings.Join(types, ",")
}

// brokersSyntax is the accepted form, ending every error of ParseBrokers.
const brokersSyntax = "want <spiffe id>=<types>[;<spiffe id>=<types>...], types pid and/or pod separated by commas (e.g. spiffe://cluster.local/ns/istio-system/sa/ztunnel=pid,pod)"

// maxBrokers bounds the list: brokers are a handful of node components.
const maxBrokers = 64

// ParseBrokers parses MESHAGENT_BROKERS: entries <spiffe id>=<types>
// separated by ';', types "pid" and "pod" separated by ','. Spaces around
// entries and types are ignored, and so are empty entries. A SPIFFE ID has
// neither '=' nor ';' nor ',' (its path segments are letters, digits, '.',
// '-' and '_'), so the separators cannot be part of one. An ID listed twice,
// a type listed twice, an entry without types or an unknown type is an
// error. Empty text allows no broker.
func ParseBrokers(raw string) ([]Broker, error) {
	var out []Broker
	for entry := range strings.SplitSeq(raw, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		id, types, ok := strings.Cut(entry, "=")
		if !ok {
			return nil, reason(brokersSyntax + ": entry " + quoteShort(entry) + " has no '='")
		}
		sid, err := spiffeid.FromString(strings.TrimSpace(id))
		if err != nil {
			return nil, reason(brokersSyntax + ": " + quoteShort(strings.TrimSpace(id)) + " is not a SPIFFE ID: " + oneLine(err.Error()))
		}
		b := Broker{ID: sid}
		for t := range strings.SplitSeq(types, ",") {
			var seen *bool
			switch strings.TrimSpace(t) {
			case BrokerRefPID:
				seen = &b.PID
			case BrokerRefPod:
				seen = &b.Pod
			default:
				return nil, reason(brokersSyntax + ": unknown reference type " + quoteShort(strings.TrimSpace(t)) + " for " + sid.String())
			}
			if *seen {
				return nil, reason(brokersSyntax + ": reference type " + strings.TrimSpace(t) + " listed twice for " + sid.String())
			}
			*seen = true
		}
		for _, prev := range out {
			if prev.ID == sid {
				return nil, reason(brokersSyntax + ": " + sid.String() + " listed twice")
			}
		}
		if len(out) == maxBrokers {
			return nil, reason(brokersSyntax + ": more than " + itoa(maxBrokers) + " brokers")
		}
		out = append(out, b)
	}
	return out, nil
}

// quoteShort quotes s for an error line, cut to a readable length.
func quoteShort(s string) string {
	const limit = 80
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "..."
	}
	return strconv.Quote(s)
}

// BrokerList is a MESHAGENT_BROKERS setting.
func BrokerList(field func(*Config) *[]Broker) Value {
	return Value{
		Type:     "brokers",
		Accepted: "<spiffe id>=<types> separated by semicolons, types pid and/or pod separated by commas, or empty for none",
		set: func(c *Config, raw string) error {
			bs, err := ParseBrokers(raw)
			if err != nil {
				return err
			}
			*field(c) = bs
			return nil
		},
		get: func(c *Config) string {
			parts := make([]string, len(*field(c)))
			for i, b := range *field(c) {
				parts[i] = b.String()
			}
			return strings.Join(parts, ";")
		},
	}
}

package trust

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
)

// ProxyConfigTypeURL is the xDS type of istiod's ProxyConfig, which an agent
// asks for on its own ADS stream (pilot-agent's PROXY_CONFIG_XDS_AGENT).
const ProxyConfigTypeURL = "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"

// ProxyConfigSourceName is the xDS source's name in logs, metrics and the
// merged bundle's description.
const ProxyConfigSourceName = "xds:proxyconfig"

// proxyConfigSink is the merger as the ProxyConfig source uses it: besides
// updates and refusals, it can be told the source holds no roots.
type proxyConfigSink interface {
	Sink
	Withdraw(source string)
}

// ProxyConfigSource takes the mesh's extra roots from the ProxyConfig istiod
// sends over xDS: its ca_certificates_pem list (meshConfig.caCertificates,
// which also carries the roots of a plugged-in CA), merged with the other
// sources. It runs nothing itself: the xDS proxy subscribes to
// ProxyConfigTypeURL on its upstream streams and hands each answer to Apply
// (xdsproxy.Subscription).
type ProxyConfigSource struct {
	sink proxyConfigSink
}

// NewProxyConfigSource returns the source reporting to m.
func NewProxyConfigSource(m *Merger) *ProxyConfigSource {
	return &ProxyConfigSource{sink: m}
}

// Apply takes one answer of the control plane: the ProxyConfig resources
// (istiod sends one). Their PEMs, together, become the source's roots,
// parsed once. An answer that does not decode, or whose PEMs do not parse,
// is refused and returned as an error (the proxy NACKs it); the source's
// last good roots stay. A ProxyConfig with no PEM at all means the mesh has
// no extra roots, as pilot-agent reads it: the source then holds none. An
// answer without any ProxyConfig says nothing (a control plane that has
// none yet): the source keeps what it holds.
func (s *ProxyConfigSource) Apply(resources []*anypb.Any) error {
	if len(resources) == 0 {
		return nil
	}
	var pems []string
	for _, r := range resources {
		got, err := proxyConfigPEMs(r)
		if err != nil {
			err = fmt.Errorf("decoding ProxyConfig: %w", err)
			s.sink.Refuse(ProxyConfigSourceName, err)
			return err
		}
		pems = append(pems, got...)
	}
	if len(pems) == 0 {
		s.sink.Withdraw(ProxyConfigSourceName)
		return nil
	}
	return s.sink.Update(ProxyConfigSourceName, []byte(strings.Join(pems, "\n")))
}

// caCertificatesPEMField is ProxyConfig's ca_certificates_pem (repeated
// string, istio.io/api mesh/v1alpha1/proxy.proto).
const caCertificatesPEMField = 34

// proxyConfigPEMs reads the ca_certificates_pem of a ProxyConfig straight
// from its wire form. The agent reads nothing else of it, and decoding
// only this field spares every agent the registration of Istio's mesh and
// networking types (their package initialisers allocate about 200 KB).
// The message's framing is checked throughout; the other fields are
// skipped unread.
func proxyConfigPEMs(r *anypb.Any) ([]string, error) {
	if r.GetTypeUrl() != ProxyConfigTypeURL {
		return nil, fmt.Errorf("resource of type %q, want %q", r.GetTypeUrl(), ProxyConfigTypeURL)
	}
	var pems []string
	b := r.GetValue()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if num == caCertificatesPEMField && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			if !utf8.Valid(v) {
				return nil, errors.New("ca_certificates_pem holds invalid UTF-8")
			}
			pems = append(pems, string(v))
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return pems, nil
}

package sds

import (
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/secretmanager"
)

// toProto turns a held secret into the Envoy Secret resource named name:
// a TlsCertificate (chain and PKCS#8 key, inline bytes) for a certificate,
// a ValidationContext (trusted CA, inline bytes) for a trust bundle.
func toProto(name string, s *secretmanager.Secret) *tlsv3.Secret {
	if s.IsRoot() {
		return &tlsv3.Secret{
			Name: name,
			Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				TrustedCa: inline(s.Roots),
			}},
		}
	}
	return &tlsv3.Secret{
		Name: name,
		Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(s.CertChain),
			PrivateKey:       inline(s.PrivateKey),
		}},
	}
}

func inline(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}

func toAny(name string, s *secretmanager.Secret) (*anypb.Any, error) {
	a, err := anypb.New(toProto(name, s))
	if err != nil {
		return nil, fmt.Errorf("encoding secret %q: %w", name, err)
	}
	return a, nil
}

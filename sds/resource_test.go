package sds

import (
	"bytes"
	"fmt"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/secretmanager"
)

// toProto is the Envoy Secret resource encodeSecret writes, built as a
// message: the reference the hand-written encoding is checked against.
func toProto(name string, s *secretmanager.Secret) *tlsv3.Secret {
	inline := func(b []byte) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
	}
	if s.IsRoot() {
		vc := &tlsv3.CertificateValidationContext{TrustedCa: inline(s.Roots)}
		if len(s.CRL) > 0 {
			vc.Crl = inline(s.CRL)
		}
		return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: vc}}
	}
	return &tlsv3.Secret{
		Name: name,
		Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(s.CertChain),
			PrivateKey:       inline(s.PrivateKey),
		}},
	}
}

func toAny(name string, s *secretmanager.Secret) (*anypb.Any, error) {
	a, err := anypb.New(toProto(name, s))
	if err != nil {
		return nil, fmt.Errorf("encoding secret %q: %w", name, err)
	}
	return a, nil
}

func TestEncodeSecretIsProtobufs(t *testing.T) {
	secrets := map[string]*secretmanager.Secret{
		"default":                       {Name: "default", CertChain: []byte("chain PEM"), PrivateKey: []byte("key PEM")},
		"ROOTCA":                        {Name: "ROOTCA", Roots: []byte("roots PEM")},
		"ROOTCA with a CRL":             {Name: "ROOTCA", Roots: []byte("roots PEM"), CRL: []byte("crl PEM")},
		"":                              {CertChain: []byte("c"), PrivateKey: []byte("k")},
		"empty key":                     {Name: "x", CertChain: []byte("c")},
		"file-root:/etc/certs/root.pem": {Name: "file-root:/etc/certs/root.pem", Roots: bytes.Repeat([]byte("r"), 300)},
	}
	for name, s := range secrets {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(toProto(name, s))
		if err != nil {
			t.Fatal(err)
		}
		if got := encodeSecret(name, s); !bytes.Equal(got, want) {
			t.Errorf("%q: encoded %x, protobuf %x", name, got, want)
		}
		var back tlsv3.Secret
		if err := proto.Unmarshal(encodeSecret(name, s), &back); err != nil || !proto.Equal(&back, toProto(name, s)) {
			t.Errorf("%q: decodes to %v (%v)", name, &back, err)
		}
	}
}

package sds

import (
	"fmt"
	"runtime"
	"sync"
	"weak"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
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

// encodedCache holds the encoded resource of each secret served, per name,
// so that a rotation pushed to many streams encodes the secret once and
// every response shares the bytes. Entries are read-only once stored. A key
// holds its secret weakly: the entry is dropped once the secret is
// collected (after a rotation replaced it and no stream holds it).
type encodedCache struct {
	mu sync.Mutex
	m  map[encodedKey]encoded
}

// encoded is a secret's resource, as a message and in wire form.
type encoded struct {
	any *anypb.Any
	// field is the resource as field 2 (resources) of a DiscoveryResponse:
	// tag, length and the encoded Any.
	field []byte
}

type encodedKey struct {
	name string
	sec  weak.Pointer[secretmanager.Secret]
}

// get returns the resource of sec under name. Secrets are never modified
// once published, so the encoding of one stays right.
func (c *encodedCache) get(name string, sec *secretmanager.Secret) (*anypb.Any, error) {
	e, err := c.lookup(name, sec)
	return e.any, err
}

// field returns the resource of sec under name as a DiscoveryResponse field.
func (c *encodedCache) field(name string, sec *secretmanager.Secret) ([]byte, error) {
	e, err := c.lookup(name, sec)
	return e.field, err
}

func (c *encodedCache) lookup(name string, sec *secretmanager.Secret) (encoded, error) {
	k := encodedKey{name: name, sec: weak.Make(sec)}
	// Encoding under the lock makes the streams of one rotation wait for
	// one encoding rather than each do its own.
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[k]; ok {
		return e, nil
	}
	a, err := toAny(name, sec)
	if err != nil {
		return encoded{}, err
	}
	b, err := proto.Marshal(a)
	if err != nil {
		return encoded{}, fmt.Errorf("encoding secret %q: %w", name, err)
	}
	e := encoded{any: a, field: protowire.AppendBytes(protowire.AppendTag(nil, fieldResources, protowire.BytesType), b)}
	if c.m == nil {
		c.m = make(map[encodedKey]encoded)
	}
	c.m[k] = e
	runtime.AddCleanup(sec, c.drop, k)
	return e, nil
}

func (c *encodedCache) drop(k encodedKey) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}

// len returns the number of entries.
func (c *encodedCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// Field numbers of envoy.service.discovery.v3.DiscoveryResponse.
const (
	fieldVersionInfo protowire.Number = 1
	fieldResources   protowire.Number = 2
	fieldTypeURL     protowire.Number = 4
	fieldNonce       protowire.Number = 5
)

// typeURLField is field 4 (type_url) of every response sent here.
var typeURLField = protowire.AppendString(protowire.AppendTag(nil, fieldTypeURL, protowire.BytesType), secretTypeURL)

// wireResponse is a DiscoveryResponse in wire form (udsserver.WireMessage):
// its own version and nonce, then the shared encodings of its resources and
// its type. Protobuf fields may come in any order.
type wireResponse struct {
	pieces [][]byte
}

func (r *wireResponse) WirePieces() [][]byte { return r.pieces }

// newWireResponse returns the response carrying the encoded resources.
func newWireResponse(version, nonce string, resources [][]byte) *wireResponse {
	head := make([]byte, 0, len(version)+len(nonce)+6)
	head = protowire.AppendString(protowire.AppendTag(head, fieldVersionInfo, protowire.BytesType), version)
	head = protowire.AppendString(protowire.AppendTag(head, fieldNonce, protowire.BytesType), nonce)
	pieces := make([][]byte, 0, len(resources)+2)
	pieces = append(pieces, head)
	pieces = append(pieces, resources...)
	pieces = append(pieces, typeURLField)
	return &wireResponse{pieces: pieces}
}

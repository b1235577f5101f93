package sds

import (
	"runtime"
	"sync"
	"weak"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/secretmanager"
)

// Field numbers of the Envoy messages a secret is encoded into
// (envoy.extensions.transport_sockets.tls.v3 and config.core.v3).
const (
	secretName              protowire.Number = 1 // Secret.name
	secretTLSCertificate    protowire.Number = 2 // Secret.tls_certificate
	secretValidationContext protowire.Number = 4 // Secret.validation_context
	tlsCertificateChain     protowire.Number = 1 // TlsCertificate.certificate_chain
	tlsPrivateKey           protowire.Number = 2 // TlsCertificate.private_key
	validationTrustedCA     protowire.Number = 1 // CertificateValidationContext.trusted_ca
	validationCRL           protowire.Number = 7 // CertificateValidationContext.crl
	dataSourceInlineBytes   protowire.Number = 2 // DataSource.inline_bytes
)

// encodeSecret returns, in wire form, the Envoy Secret resource named name
// holding s: a TlsCertificate (chain and PKCS#8 key, inline bytes) for a
// certificate, a ValidationContext (trusted CA and, when there is one, the
// CRL, inline bytes) for a trust bundle. The bytes are those protobuf's deterministic encoding gives the
// same message (TestEncodeSecretIsProtobufs); writing them directly spares
// building the message and, at start-up, protobuf's reflective set-up of
// these types on the way to the first certificate.
func encodeSecret(name string, s *secretmanager.Secret) []byte {
	var body []byte
	if s.IsRoot() {
		body = appendField(nil, validationTrustedCA, inlineBytes(s.Roots))
		if len(s.CRL) > 0 {
			body = appendField(body, validationCRL, inlineBytes(s.CRL))
		}
		return appendField(appendName(name), secretValidationContext, body)
	}
	body = appendField(nil, tlsCertificateChain, inlineBytes(s.CertChain))
	body = appendField(body, tlsPrivateKey, inlineBytes(s.PrivateKey))
	return appendField(appendName(name), secretTLSCertificate, body)
}

func appendName(name string) []byte {
	if name == "" {
		return nil
	}
	return protowire.AppendString(protowire.AppendTag(nil, secretName, protowire.BytesType), name)
}

// inlineBytes is a DataSource holding b inline (a oneof member: present
// even when empty).
func inlineBytes(b []byte) []byte {
	return appendField(nil, dataSourceInlineBytes, b)
}

func appendField(b []byte, num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
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
	// tag, length and the encoded Any; a buffer made once, sent by every
	// response that carries it.
	field mem.Buffer
}

type encodedKey struct {
	name string
	sec  weak.Pointer[secretmanager.Secret]
}

// get returns the resource of sec under name. Secrets are never modified
// once published, so the encoding of one stays right.
func (c *encodedCache) get(name string, sec *secretmanager.Secret) *anypb.Any {
	return c.lookup(name, sec).any
}

// field returns the resource of sec under name as a DiscoveryResponse field.
func (c *encodedCache) field(name string, sec *secretmanager.Secret) mem.Buffer {
	return c.lookup(name, sec).field
}

func (c *encodedCache) lookup(name string, sec *secretmanager.Secret) encoded {
	k := encodedKey{name: name, sec: weak.Make(sec)}
	// Encoding under the lock makes the streams of one rotation wait for
	// one encoding rather than each do its own.
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[k]; ok {
		return e
	}
	a := &anypb.Any{TypeUrl: secretTypeURL, Value: encodeSecret(name, sec)}
	var b []byte
	b = appendField(b, anyTypeURL, []byte(a.TypeUrl))
	b = appendField(b, anyValue, a.Value)
	e := encoded{any: a, field: mem.SliceBuffer(appendField(nil, fieldResources, b))}
	if c.m == nil {
		c.m = make(map[encodedKey]encoded)
	}
	c.m[k] = e
	runtime.AddCleanup(sec, c.drop, k)
	return e
}

func (c *encodedCache) drop(k encodedKey) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}

// Field numbers of google.protobuf.Any.
const (
	anyTypeURL protowire.Number = 1
	anyValue   protowire.Number = 2
)

// Field numbers of envoy.service.discovery.v3.DiscoveryResponse.
const (
	fieldVersionInfo protowire.Number = 1
	fieldResources   protowire.Number = 2
	fieldTypeURL     protowire.Number = 4
	fieldNonce       protowire.Number = 5
)

// typeURLField is field 4 (type_url) of every response sent here.
var typeURLField mem.Buffer = mem.SliceBuffer(protowire.AppendString(protowire.AppendTag(nil, fieldTypeURL, protowire.BytesType), secretTypeURL))

// wireResponse is a DiscoveryResponse in wire form (udsserver.WireMessage):
// its own version and nonce, then the shared encodings of its resources and
// its type. Protobuf fields may come in any order.
type wireResponse struct {
	buffers mem.BufferSlice
}

func (r *wireResponse) WireBuffers() mem.BufferSlice { return r.buffers }

// newWireResponse returns the response carrying the encoded resources.
func newWireResponse(version, nonce string, resources []mem.Buffer) *wireResponse {
	head := make([]byte, 0, len(version)+len(nonce)+6)
	head = protowire.AppendString(protowire.AppendTag(head, fieldVersionInfo, protowire.BytesType), version)
	head = protowire.AppendString(protowire.AppendTag(head, fieldNonce, protowire.BytesType), nonce)
	buffers := make(mem.BufferSlice, 0, len(resources)+2)
	buffers = append(buffers, mem.SliceBuffer(head))
	buffers = append(buffers, resources...)
	buffers = append(buffers, typeURLField)
	return &wireResponse{buffers: buffers}
}

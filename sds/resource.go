package sds

import (
	"fmt"
	"runtime"
	"sync"
	"weak"

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

// encodedCache holds the encoded resource of each secret served, per name,
// so that a rotation pushed to many streams encodes the secret once and
// every response shares the bytes. Entries are read-only once stored. A key
// holds its secret weakly: the entry is dropped once the secret is
// collected (after a rotation replaced it and no stream holds it).
type encodedCache struct {
	mu sync.Mutex
	m  map[encodedKey]*anypb.Any
}

type encodedKey struct {
	name string
	sec  weak.Pointer[secretmanager.Secret]
}

// get returns the encoded resource of sec under name. Secrets are never
// modified once published, so the encoding of one stays right.
func (c *encodedCache) get(name string, sec *secretmanager.Secret) (*anypb.Any, error) {
	k := encodedKey{name: name, sec: weak.Make(sec)}
	// Encoding under the lock makes the streams of one rotation wait for
	// one encoding rather than each do its own.
	c.mu.Lock()
	defer c.mu.Unlock()
	if a, ok := c.m[k]; ok {
		return a, nil
	}
	a, err := toAny(name, sec)
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = make(map[encodedKey]*anypb.Any)
	}
	c.m[k] = a
	runtime.AddCleanup(sec, c.drop, k)
	return a, nil
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

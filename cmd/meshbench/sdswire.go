package main

import (
	"fmt"
	"hash/fnv"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/internal/wirefields"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The streams of a streamSet stand in for Envoy, which runs on cores of its
// own. On the benchmark machine they share the agent's cores, so they read
// SDS responses and write ACKs in wire form: they read only the fields they
// check (field numbers of envoy.service.discovery.v3 and
// envoy.extensions.transport_sockets.tls.v3) and never build the messages.

// wireMessage is one message as gRPC received it, or one to send as is.
type wireMessage struct{ data []byte }

// wireCodec sends and receives *wireMessage without (un)marshalling.
type wireCodec struct{}

func (wireCodec) Name() string { return "proto" }

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*wireMessage)
	if !ok {
		return nil, fmt.Errorf("cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(m.data)}, nil
}

func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*wireMessage)
	if !ok {
		return fmt.Errorf("cannot unmarshal into %T", v)
	}
	m.data = data.Materialize()
	return nil
}

// sdsResponse is what a stream reads of a DiscoveryResponse.
type sdsResponse struct {
	version, nonce string
	// key identifies the certificate chain of the secret asked for (see
	// certKey).
	key uint64
}

// scanSDSResponse reads a DiscoveryResponse holding the TLS secret name: its
// version, nonce and the key of its certificate chain. It fails where certKey
// fails.
func scanSDSResponse(b []byte, name string) (sdsResponse, error) {
	var (
		r        sdsResponse
		typeURL  string
		found    bool
		nres     int
		chainErr error
	)
	err := scanFields(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			r.version = string(v)
		case 2: // resources: google.protobuf.Any
			nres++
			if found {
				return nil
			}
			var anyType string
			var value []byte
			if err := scanFields(v, func(num protowire.Number, v []byte) error {
				switch num {
				case 1:
					anyType = string(v)
				case 2:
					value = v
				}
				return nil
			}); err != nil {
				return err
			}
			if anyType != resource.SecretType {
				chainErr = fmt.Errorf("decoding secret: resource of type %q", anyType)
				return nil
			}
			key, ok, err := secretChainKey(value, name)
			if err != nil {
				return fmt.Errorf("decoding secret: %w", err)
			}
			if ok {
				r.key, found = key, true
			}
		case 4:
			typeURL = string(v)
		case 5:
			r.nonce = string(v)
		}
		return nil
	})
	switch {
	case err != nil:
		return r, err
	case typeURL != resource.SecretType:
		return r, fmt.Errorf("response of type %q, want %q", typeURL, resource.SecretType)
	case found:
		return r, nil
	case chainErr != nil:
		return r, chainErr
	default:
		return r, fmt.Errorf("response has no secret %q (%d resources)", name, nres)
	}
}

// secretChainKey reads a tls.v3.Secret: ok is false when it is another
// secret; an error when it is this one without an inline certificate chain.
func secretChainKey(b []byte, name string) (key uint64, ok bool, err error) {
	var secretName string
	var chain []byte
	err = scanFields(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			secretName = string(v)
		case 2: // tls_certificate
			return scanFields(v, func(num protowire.Number, v []byte) error {
				if num != 1 { // certificate_chain: config.core.v3.DataSource
					return nil
				}
				return scanFields(v, func(num protowire.Number, v []byte) error {
					if num == 2 { // inline_bytes
						chain = v
					}
					return nil
				})
			})
		}
		return nil
	})
	if err != nil || secretName != name {
		return 0, false, err
	}
	if len(chain) == 0 {
		return 0, false, fmt.Errorf("secret %q has no inline certificate chain", name)
	}
	h := fnv.New64a()
	h.Write(chain)
	return h.Sum64(), true, nil
}

// scanFields calls fn with each length-delimited field of the message b and
// skips the others.
func scanFields(b []byte, fn func(num protowire.Number, v []byte) error) error {
	return wirefields.Walk(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		return fn(num, v)
	})
}

// nodeWire is benchNode in wire form.
var nodeWire = func() []byte {
	b, err := proto.Marshal(benchNode)
	if err != nil {
		panic(err)
	}
	return b
}()

// appendSDSRequest appends a DiscoveryRequest for the secret name in wire
// form: the first request of a stream (version and nonce empty) or the ACK
// of a response.
func appendSDSRequest(b []byte, name, version, nonce string) []byte {
	if version != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, version)
	}
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, nodeWire)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	b = protowire.AppendString(b, resource.SecretType)
	if nonce != "" {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendString(b, nonce)
	}
	return b
}

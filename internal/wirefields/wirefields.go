// Package wirefields walks the fields of a protobuf message in wire form,
// for code that reads a few fields of a message without decoding it: Walk
// for a message in one slice (the SDS server's requests, the benchmark's SDS
// responses), Reader for one in a gRPC buffer slice (the xDS proxy's
// responses). Varints are decoded by protowire in both.
package wirefields

import (
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
)

// ErrMalformed: the bytes are not a protobuf message.
var ErrMalformed = errors.New("malformed protobuf")

// Walk calls fn with each field of the message b, in order: its number, its
// wire type and its value (for a length-delimited field the bytes inside,
// otherwise the encoded value, for example a varint for
// protowire.ConsumeVarint). It stops at fn's first error, and returns
// ErrMalformed for a truncated or invalid field. The values share b's memory.
func Walk(b []byte, fn func(num protowire.Number, typ protowire.Type, value []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return ErrMalformed
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n >= 0 {
				v = b[:n]
			}
		}
		if n < 0 {
			return ErrMalformed
		}
		b = b[n:]
		if err := fn(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}

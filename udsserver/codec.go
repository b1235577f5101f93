package udsserver

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// WireMessage is a message a service hands to Send already in its protobuf
// wire form, split in pieces (their concatenation is the message). The
// socket's codec sends the pieces as they are, without marshalling or
// copying them, so pieces shared by many messages (a secret sent on every
// stream) are encoded once. The pieces must not be changed afterwards.
type WireMessage interface {
	WirePieces() [][]byte
}

// WireDecoder is a message a service receives into that reads its own
// protobuf wire form (RecvMsg with it), instead of protobuf's reflective
// decoding. DecodeWire must not keep b, which gRPC reuses once it returns.
type WireDecoder interface {
	DecodeWire(b []byte) error
}

// codec is gRPC's protobuf codec, except that a WireMessage is sent as is
// and a WireDecoder decodes itself.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2(proto.Name)} }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	w, ok := v.(WireMessage)
	if !ok {
		return c.proto.Marshal(v)
	}
	pieces := w.WirePieces()
	out := make(mem.BufferSlice, 0, len(pieces))
	for _, p := range pieces {
		if len(p) > 0 {
			// A SliceBuffer is never returned to a pool: the shared bytes
			// stay with their owner.
			out = append(out, mem.SliceBuffer(p))
		}
	}
	return out, nil
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	d, ok := v.(WireDecoder)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	if len(data) == 1 {
		return d.DecodeWire(data[0].ReadOnlyData())
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return d.DecodeWire(buf.ReadOnlyData())
}

func (c codec) Name() string { return proto.Name }

package udsserver

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// WireMessage is a message a service hands to Send already in its protobuf
// wire form, split in buffers (their concatenation is the message). The
// socket's codec sends the buffers as they are, without marshalling or
// copying them, so buffers shared by many messages (a secret sent on every
// stream, as a mem.SliceBuffer made once) are encoded once. gRPC frees each
// buffer once written: shared ones must not come from a pool.
type WireMessage interface {
	WireBuffers() mem.BufferSlice
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
	if w, ok := v.(WireMessage); ok {
		return w.WireBuffers(), nil
	}
	return c.proto.Marshal(v)
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

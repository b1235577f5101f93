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

// codec is gRPC's protobuf codec, except that a WireMessage is sent as is.
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

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

func (c codec) Name() string { return proto.Name }

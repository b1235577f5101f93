package xdsproxy

import (
	"fmt"

	"google.golang.org/grpc/mem"
)

// frame is one gRPC message held as the bytes that came off the wire. A
// received frame owns one reference to its buffers; free releases it.
type frame struct {
	data mem.BufferSlice
}

func bytesFrame(b []byte) *frame { return &frame{data: mem.BufferSlice{mem.SliceBuffer(b)}} }

func (f *frame) free() {
	f.data.Free()
	f.data = nil
}

// rawCodec moves frames through gRPC without decoding them: Unmarshal keeps a
// reference to the received buffers and Marshal hands the same buffers back,
// so a response is never copied into a Go message and out again.
//
// It calls itself "proto" so the content-type on the wire stays
// application/grpc+proto: the bytes are protobuf, the codec just does not
// look at them.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("raw codec cannot marshal %T", v)
	}
	// gRPC frees what Marshal returns once written; the frame keeps its own
	// reference until its holder frees it.
	f.data.Ref()
	return f.data, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("raw codec cannot unmarshal into %T", v)
	}
	// gRPC frees data when Unmarshal returns; keep a reference of our own.
	data.Ref()
	f.data = data
	return nil
}

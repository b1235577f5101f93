package udsserver

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

type pieces [][]byte

func (p pieces) WireBuffers() mem.BufferSlice {
	out := make(mem.BufferSlice, len(p))
	for i, b := range p {
		out[i] = mem.SliceBuffer(b)
	}
	return out
}

// A WireMessage is sent as its pieces, in order, without a copy; anything
// else is marshalled as protobuf, and both read back as protobuf.
func TestCodecSendsWirePiecesAsTheyAre(t *testing.T) {
	c := newCodec()
	want, err := proto.Marshal(wrapperspb.String("shared bytes"))
	if err != nil {
		t.Fatal(err)
	}
	shared := bytes.Clone(want)
	out, err := c.Marshal(pieces{shared[:3], shared[3:]})
	if err != nil {
		t.Fatal(err)
	}
	if got := out.Materialize(); !bytes.Equal(got, want) {
		t.Fatalf("wire message sent as %q, want %q", got, want)
	}
	if len(out) != 2 || &out[0].ReadOnlyData()[0] != &shared[0] {
		t.Fatal("the pieces were copied")
	}
	out.Free()
	if !bytes.Equal(shared, want) {
		t.Fatal("freeing the sent message changed the shared bytes")
	}

	var back wrapperspb.StringValue
	if err := c.Unmarshal(out, &back); err != nil || back.GetValue() != "shared bytes" {
		t.Fatalf("read back %q, %v", back.GetValue(), err)
	}
	plain, err := c.Marshal(wrapperspb.String("shared bytes"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(plain.Materialize(), want) {
		t.Fatal("a protobuf message is not marshalled as protobuf")
	}
}

type wireBytes struct{ got []byte }

func (w *wireBytes) DecodeWire(b []byte) error {
	w.got = bytes.Clone(b)
	return nil
}

// A WireDecoder gets the message's bytes whole, from one buffer or several.
func TestCodecHandsAWireDecoderTheWholeMessage(t *testing.T) {
	c := newCodec()
	msg := []byte("one message received in pieces")
	for _, data := range []mem.BufferSlice{
		{mem.SliceBuffer(msg)},
		{mem.SliceBuffer(msg[:5]), mem.SliceBuffer(msg[5:11]), mem.SliceBuffer(msg[11:])},
	} {
		var w wireBytes
		if err := c.Unmarshal(data, &w); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(w.got, msg) {
			t.Errorf("%d buffers decoded as %q, want %q", len(data), w.got, msg)
		}
	}
}

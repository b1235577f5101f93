package wirefields

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

type field struct {
	num   protowire.Number
	typ   protowire.Type
	value string
}

func TestWalkReadsEachField(t *testing.T) {
	var b []byte
	b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), "one")
	b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.VarintType), 300)
	b = protowire.AppendFixed32(protowire.AppendTag(b, 3, protowire.Fixed32Type), 7)
	b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), "")
	var got []field
	if err := Walk(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		got = append(got, field{num, typ, string(v)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []field{
		{1, protowire.BytesType, "one"},
		{2, protowire.VarintType, string(protowire.AppendVarint(nil, 300))},
		{3, protowire.Fixed32Type, string(protowire.AppendFixed32(nil, 7))},
		{1, protowire.BytesType, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("field %d: got %v, want %v", i, got[i], want[i])
		}
	}
}

func TestWalkRefusesMalformedAndStopsAtTheCallersError(t *testing.T) {
	for name, b := range map[string][]byte{
		"truncated length": {0x0a, 0x05, 'a'},
		"truncated varint": {0x10, 0xff},
		"field number 0":   {0x02, 0x00},
		"bad tag":          {0xff},
	} {
		if err := Walk(b, func(protowire.Number, protowire.Type, []byte) error { return nil }); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	stop := errors.New("stop")
	calls := 0
	b := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "x")
	b = append(b, b...)
	if err := Walk(b, func(protowire.Number, protowire.Type, []byte) error { calls++; return stop }); err != stop || calls != 1 {
		t.Errorf("err %v after %d calls, want stop after 1", err, calls)
	}
}

func FuzzWalk(f *testing.F) {
	f.Add(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "x"))
	f.Fuzz(func(t *testing.T, b []byte) {
		total := 0
		_ = Walk(b, func(_ protowire.Number, _ protowire.Type, v []byte) error {
			total += len(v)
			return nil
		})
		if total > len(b) {
			t.Fatalf("values of %d bytes in a %d-byte message", total, len(b))
		}
	})
}

// chunked splits b into buffers of at most n bytes, as gRPC hands over a
// message that arrived in several HTTP/2 frames.
func chunked(b []byte, n int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		s = append(s, mem.SliceBuffer(b[:k]))
		b = b[k:]
	}
	return s
}

// readFields reads the top-level fields of the message in s with a Reader:
// for a length-delimited field its bytes, for others the encoded value.
func readFields(s mem.BufferSlice, whole []byte) ([]field, error) {
	r := NewReader(s)
	var got []field
	for !r.Done(r.Len()) {
		num, typ, err := r.Tag(r.Len())
		if err != nil {
			return got, err
		}
		var v string
		if typ == protowire.BytesType {
			v, err = r.String(r.Len())
		} else {
			start := r.pos
			err = r.SkipValue(num, typ, r.Len())
			v = string(whole[start:r.pos])
		}
		if err != nil {
			return got, err
		}
		got = append(got, field{num, typ, v})
	}
	return got, nil
}

func TestReaderAcrossBuffers(t *testing.T) {
	var b []byte
	b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), strings.Repeat("x", 300))
	b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.VarintType), 1<<63)
	b = protowire.AppendFixed64(protowire.AppendTag(b, 3, protowire.Fixed64Type), 7)
	b = protowire.AppendTag(b, 4, protowire.StartGroupType)
	b = protowire.AppendVarint(protowire.AppendTag(b, 5, protowire.VarintType), 1)
	b = protowire.AppendTag(b, 4, protowire.EndGroupType)
	want, err := readFields(chunked(b, len(b)), b)
	if err != nil || len(want) != 4 {
		t.Fatalf("in one buffer: %v, %v", want, err)
	}
	for n := 1; n < 12; n++ {
		got, err := readFields(chunked(b, n), b)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("in buffers of %d bytes: %v, %v", n, got, err)
		}
	}
	for _, bad := range [][]byte{
		{0x10, 0xff},             // truncated varint
		{0x0a, 0x05, 'a'},        // length past the end
		{0x02, 0x00},             // field number 0
		{0x0b, 0x08, 0x01},       // unterminated group
		{0x0b, 0x08, 0x01, 0x14}, // mismatched end of group
		{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, // varint overflows
	} {
		if _, err := readFields(chunked(bad, 1), bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("% x: %v, want ErrMalformed", bad, err)
		}
	}
}

// Reader, over any split into buffers, reads the fields Walk reads from the
// whole message, and refuses what Walk refuses (but for groups nested deeper
// than Reader allows).
func FuzzReaderAgreesWithWalk(f *testing.F) {
	f.Add(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "x"), uint8(0))
	f.Add([]byte{0x08, 0x96, 0x01, 0x0b, 0x10, 0x01, 0x0c, 0x1d, 1, 2, 3, 4}, uint8(1))
	f.Add([]byte{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, uint8(2))
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8) {
		var want []field
		walkErr := Walk(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
			want = append(want, field{num, typ, string(v)})
			return nil
		})
		got, err := readFields(chunked(b, int(chunk)+1), b)
		switch {
		case walkErr != nil && err == nil:
			t.Fatalf("Walk refuses (%v) what Reader reads: %v", walkErr, got)
		case walkErr == nil && err != nil:
			if strings.Contains(err.Error(), "nested too deep") {
				return
			}
			t.Fatalf("Reader refuses (%v) what Walk reads: %v", err, want)
		case err == nil && !slices.Equal(got, want):
			t.Fatalf("Reader read %v, Walk %v", got, want)
		}
	})
}

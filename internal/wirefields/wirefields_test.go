package wirefields

import (
	"errors"
	"testing"

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

package wirefields

import (
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// maxGroupDepth bounds nested groups in skipped fields.
const maxGroupDepth = 64

// maxVarintLen is the longest a varint may be.
const maxVarintLen = 10

// Reader reads a message in wire form field by field from a gRPC buffer
// slice, for a message too large to gather into one slice first (an xDS
// response of many megabytes arrives in many buffers). It neither copies the
// buffers nor takes their ownership (unlike mem.Reader, which frees what it
// has read). Every read is bounded by an end position: the message's
// (Len), or that of a length-delimited field being read (Sub). Errors wrap
// ErrMalformed. Not safe for concurrent use.
type Reader struct {
	bufs mem.BufferSlice
	i    int    // index of the buffer cur comes from
	cur  []byte // unread part of bufs[i]
	pos  int    // bytes consumed so far
	size int    // total length
}

// NewReader reads s from its start.
func NewReader(s mem.BufferSlice) *Reader {
	r := &Reader{bufs: s, size: s.Len(), i: -1}
	r.advance()
	return r
}

// Len is the length of the whole message: the end of its top level.
func (r *Reader) Len() int { return r.size }

// Done reports whether the reader has reached end.
func (r *Reader) Done(end int) bool { return r.pos >= end }

// advance moves cur to the next non-empty buffer.
func (r *Reader) advance() {
	for len(r.cur) == 0 && r.i+1 < len(r.bufs) {
		r.i++
		r.cur = r.bufs[r.i].ReadOnlyData()
	}
}

// varint reads a varint that ends before end. protowire decodes it, from
// the current buffer when it holds the whole varint, else from its bytes
// gathered across buffers.
func (r *Reader) varint(end int) (uint64, error) {
	avail := end - r.pos
	if avail <= 0 {
		return 0, fmt.Errorf("%w: unexpected end", ErrMalformed)
	}
	v, n := protowire.ConsumeVarint(r.cur[:min(len(r.cur), avail)])
	if n < 0 && len(r.cur) < min(avail, maxVarintLen) {
		var buf [maxVarintLen]byte
		v, n = protowire.ConsumeVarint(buf[:r.peek(buf[:min(avail, maxVarintLen)])])
	}
	if n < 0 {
		return 0, fmt.Errorf("%w: %v", ErrMalformed, protowire.ParseError(n))
	}
	return v, r.Skip(n, end)
}

// peek copies the next len(b) bytes, or as many as there are, into b
// without consuming them, and returns how many it copied.
func (r *Reader) peek(b []byte) int {
	n := copy(b, r.cur)
	for i := r.i + 1; n < len(b) && i < len(r.bufs); i++ {
		n += copy(b[n:], r.bufs[i].ReadOnlyData())
	}
	return n
}

// Tag reads a field's tag, which must end before end.
func (r *Reader) Tag(end int) (protowire.Number, protowire.Type, error) {
	v, err := r.varint(end)
	if err != nil {
		return 0, 0, err
	}
	num, typ := protowire.DecodeTag(v)
	if num < protowire.MinValidNumber || num > protowire.MaxValidNumber {
		return 0, 0, fmt.Errorf("%w: field number %d", ErrMalformed, num)
	}
	return num, typ, nil
}

// Skip discards n bytes, which must all lie before end.
func (r *Reader) Skip(n, end int) error {
	if n < 0 || n > end-r.pos {
		return fmt.Errorf("%w: length %d runs past the end", ErrMalformed, n)
	}
	for n > 0 {
		k := min(n, len(r.cur))
		r.cur = r.cur[k:]
		r.pos += k
		n -= k
		r.advance()
	}
	return nil
}

// Sub reads the length prefix of a length-delimited value, which must end
// before limit, and returns where the value ends.
func (r *Reader) Sub(limit int) (int, error) {
	v, err := r.varint(limit)
	if err != nil {
		return 0, err
	}
	if v > uint64(limit-r.pos) {
		return 0, fmt.Errorf("%w: length %d runs past the end", ErrMalformed, v)
	}
	return r.pos + int(v), nil
}

// String reads a length-delimited value, which must end before limit.
func (r *Reader) String(limit int) (string, error) {
	end, err := r.Sub(limit)
	if err != nil {
		return "", err
	}
	n := end - r.pos
	if n <= len(r.cur) {
		s := string(r.cur[:n])
		return s, r.Skip(n, end)
	}
	b := make([]byte, 0, n)
	for r.pos < end {
		k := min(end-r.pos, len(r.cur))
		b = append(b, r.cur[:k]...)
		if err := r.Skip(k, end); err != nil {
			return "", err
		}
	}
	return string(b), nil
}

// SkipValue skips the value of a field whose tag (num, typ) was just read;
// the value must end before end. Groups nest at most 64 deep.
func (r *Reader) SkipValue(num protowire.Number, typ protowire.Type, end int) error {
	return r.skipValue(num, typ, end, 0)
}

func (r *Reader) skipValue(num protowire.Number, typ protowire.Type, end, depth int) error {
	switch typ {
	case protowire.VarintType:
		_, err := r.varint(end)
		return err
	case protowire.Fixed32Type:
		return r.Skip(4, end)
	case protowire.Fixed64Type:
		return r.Skip(8, end)
	case protowire.BytesType:
		e, err := r.Sub(end)
		if err != nil {
			return err
		}
		return r.Skip(e-r.pos, e)
	case protowire.StartGroupType:
		if depth >= maxGroupDepth {
			return fmt.Errorf("%w: groups nested too deep", ErrMalformed)
		}
		for {
			if r.Done(end) {
				return fmt.Errorf("%w: unterminated group", ErrMalformed)
			}
			n, t, err := r.Tag(end)
			if err != nil {
				return err
			}
			if t == protowire.EndGroupType {
				if n != num {
					return fmt.Errorf("%w: mismatched end of group", ErrMalformed)
				}
				return nil
			}
			if err := r.skipValue(n, t, end, depth+1); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%w: wire type %d", ErrMalformed, typ)
	}
}

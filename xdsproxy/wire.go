package xdsproxy

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// The proxy reads a few top-level fields of each response straight from the
// wire (type URL, nonce, and for delta the name and version of each resource)
// and skips everything else, so the resources themselves are never decoded.
// Field numbers are those of envoy.service.discovery.v3.

// DiscoveryResponse fields.
const (
	sotwRespTypeURL protowire.Number = 4
	sotwRespNonce   protowire.Number = 5
)

// DeltaDiscoveryResponse fields.
const (
	deltaRespResources            protowire.Number = 2
	deltaRespTypeURL              protowire.Number = 4
	deltaRespNonce                protowire.Number = 5
	deltaRespRemovedResources     protowire.Number = 6
	deltaRespRemovedResourceNames protowire.Number = 8
)

// Resource fields (inside DeltaDiscoveryResponse.resources).
const (
	resourceVersion      protowire.Number = 1
	resourceName         protowire.Number = 3
	resourceResourceName protowire.Number = 8
)

// ResourceName field.
const resourceNameName protowire.Number = 1

// maxGroupDepth bounds nested groups in skipped unknown fields.
const maxGroupDepth = 64

var errMalformed = errors.New("malformed protobuf")

// sotwResponseInfo is what the proxy needs of a SotW response.
type sotwResponseInfo struct {
	typeURL string
	nonce   string
}

// deltaResponseInfo is what the proxy needs of a delta response.
type deltaResponseInfo struct {
	typeURL   string
	nonce     string
	resources []resourceVersionInfo
	removed   []string
}

type resourceVersionInfo struct {
	name    string
	version string
}

// scanSotwResponse reads the type URL and nonce of a DiscoveryResponse.
func scanSotwResponse(data mem.BufferSlice) (sotwResponseInfo, error) {
	var info sotwResponseInfo
	r := newWireReader(data)
	for !r.done(r.size) {
		num, typ, err := r.tag(r.size)
		if err != nil {
			return info, err
		}
		switch {
		case num == sotwRespTypeURL && typ == protowire.BytesType:
			info.typeURL, err = r.str(r.size)
		case num == sotwRespNonce && typ == protowire.BytesType:
			info.nonce, err = r.str(r.size)
		default:
			err = r.skipValue(num, typ, r.size, 0)
		}
		if err != nil {
			return info, err
		}
	}
	return info, nil
}

// scanDeltaResponse reads the type URL, nonce, resource names and versions,
// and removed names of a DeltaDiscoveryResponse.
func scanDeltaResponse(data mem.BufferSlice) (deltaResponseInfo, error) {
	var info deltaResponseInfo
	r := newWireReader(data)
	for !r.done(r.size) {
		num, typ, err := r.tag(r.size)
		if err != nil {
			return info, err
		}
		switch {
		case num == deltaRespTypeURL && typ == protowire.BytesType:
			info.typeURL, err = r.str(r.size)
		case num == deltaRespNonce && typ == protowire.BytesType:
			info.nonce, err = r.str(r.size)
		case num == deltaRespRemovedResources && typ == protowire.BytesType:
			var name string
			name, err = r.str(r.size)
			info.removed = append(info.removed, name)
		case num == deltaRespRemovedResourceNames && typ == protowire.BytesType:
			var name string
			name, err = r.resourceName(r.size)
			info.removed = append(info.removed, name)
		case num == deltaRespResources && typ == protowire.BytesType:
			var rv resourceVersionInfo
			rv, err = r.resource()
			info.resources = append(info.resources, rv)
		default:
			err = r.skipValue(num, typ, r.size, 0)
		}
		if err != nil {
			return info, err
		}
	}
	return info, nil
}

// resource reads one length-prefixed Resource: its name and version.
func (r *wireReader) resource() (resourceVersionInfo, error) {
	var rv resourceVersionInfo
	end, err := r.sub(r.size)
	if err != nil {
		return rv, err
	}
	var name, rnName string
	for !r.done(end) {
		num, typ, err := r.tag(end)
		if err != nil {
			return rv, err
		}
		switch {
		case num == resourceName && typ == protowire.BytesType:
			name, err = r.str(end)
		case num == resourceVersion && typ == protowire.BytesType:
			rv.version, err = r.str(end)
		case num == resourceResourceName && typ == protowire.BytesType:
			// Repeated occurrences of a message field merge: a later name
			// replaces an earlier one only where it appears.
			rnName, err = r.mergeResourceName(end, rnName)
		default:
			err = r.skipValue(num, typ, end, 0)
		}
		if err != nil {
			return rv, err
		}
	}
	rv.name = name
	if rv.name == "" {
		rv.name = rnName
	}
	return rv, nil
}

// resourceName reads one length-prefixed ResourceName and returns its name.
func (r *wireReader) resourceName(limit int) (string, error) {
	return r.mergeResourceName(limit, "")
}

func (r *wireReader) mergeResourceName(limit int, name string) (string, error) {
	end, err := r.sub(limit)
	if err != nil {
		return "", err
	}
	for !r.done(end) {
		num, typ, err := r.tag(end)
		if err != nil {
			return "", err
		}
		if num == resourceNameName && typ == protowire.BytesType {
			name, err = r.str(end)
		} else {
			err = r.skipValue(num, typ, end, 0)
		}
		if err != nil {
			return "", err
		}
	}
	return name, nil
}

// wireReader walks a BufferSlice without copying it or taking its buffers'
// ownership (unlike mem.Reader, which frees what it has read).
type wireReader struct {
	bufs mem.BufferSlice
	i    int    // index of the buffer cur comes from
	cur  []byte // unread part of bufs[i]
	pos  int    // bytes consumed so far
	size int    // total length
}

func newWireReader(s mem.BufferSlice) *wireReader {
	r := &wireReader{bufs: s, size: s.Len(), i: -1}
	r.advance()
	return r
}

// advance moves cur to the next non-empty buffer.
func (r *wireReader) advance() {
	for len(r.cur) == 0 && r.i+1 < len(r.bufs) {
		r.i++
		r.cur = r.bufs[r.i].ReadOnlyData()
	}
}

// done reports whether the reader has reached end.
func (r *wireReader) done(end int) bool { return r.pos >= end }

func (r *wireReader) byte(end int) (byte, error) {
	if r.pos >= end || len(r.cur) == 0 {
		return 0, fmt.Errorf("%w: unexpected end", errMalformed)
	}
	b := r.cur[0]
	r.cur = r.cur[1:]
	r.pos++
	r.advance()
	return b, nil
}

func (r *wireReader) varint(end int) (uint64, error) {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		b, err := r.byte(end)
		if err != nil {
			return 0, err
		}
		if shift == 63 && b > 1 {
			return 0, fmt.Errorf("%w: varint overflows", errMalformed)
		}
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v, nil
		}
	}
	return 0, fmt.Errorf("%w: varint too long", errMalformed)
}

func (r *wireReader) tag(end int) (protowire.Number, protowire.Type, error) {
	v, err := r.varint(end)
	if err != nil {
		return 0, 0, err
	}
	num, typ := protowire.DecodeTag(v)
	if num < protowire.MinValidNumber || num > protowire.MaxValidNumber {
		return 0, 0, fmt.Errorf("%w: field number %d", errMalformed, num)
	}
	return num, typ, nil
}

// skip discards n bytes, which must all lie before end.
func (r *wireReader) skip(n, end int) error {
	if n < 0 || n > end-r.pos {
		return fmt.Errorf("%w: length %d runs past the end", errMalformed, n)
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

// sub reads a length prefix and returns where the value ends.
func (r *wireReader) sub(limit int) (int, error) {
	v, err := r.varint(limit)
	if err != nil {
		return 0, err
	}
	if v > uint64(limit-r.pos) {
		return 0, fmt.Errorf("%w: length %d runs past the end", errMalformed, v)
	}
	return r.pos + int(v), nil
}

// str reads a length-prefixed string.
func (r *wireReader) str(limit int) (string, error) {
	end, err := r.sub(limit)
	if err != nil {
		return "", err
	}
	n := end - r.pos
	if n <= len(r.cur) {
		s := string(r.cur[:n])
		return s, r.skip(n, end)
	}
	b := make([]byte, 0, n)
	for r.pos < end {
		k := min(end-r.pos, len(r.cur))
		b = append(b, r.cur[:k]...)
		if err := r.skip(k, end); err != nil {
			return "", err
		}
	}
	return string(b), nil
}

// skipValue skips the value of a field whose tag was just read.
func (r *wireReader) skipValue(num protowire.Number, typ protowire.Type, end, depth int) error {
	switch typ {
	case protowire.VarintType:
		_, err := r.varint(end)
		return err
	case protowire.Fixed32Type:
		return r.skip(4, end)
	case protowire.Fixed64Type:
		return r.skip(8, end)
	case protowire.BytesType:
		e, err := r.sub(end)
		if err != nil {
			return err
		}
		return r.skip(e-r.pos, e)
	case protowire.StartGroupType:
		if depth >= maxGroupDepth {
			return fmt.Errorf("%w: groups nested too deep", errMalformed)
		}
		for {
			if r.done(end) {
				return fmt.Errorf("%w: unterminated group", errMalformed)
			}
			n, t, err := r.tag(end)
			if err != nil {
				return err
			}
			if t == protowire.EndGroupType {
				if n != num {
					return fmt.Errorf("%w: mismatched end of group", errMalformed)
				}
				return nil
			}
			if err := r.skipValue(n, t, end, depth+1); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%w: wire type %d", errMalformed, typ)
	}
}

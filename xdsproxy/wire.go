package xdsproxy

import (
	"github.com/meshagent/meshagent/internal/wirefields"
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

var errMalformed = wirefields.ErrMalformed

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
	r := wirefields.NewReader(data)
	for !r.Done(r.Len()) {
		num, typ, err := r.Tag(r.Len())
		if err != nil {
			return info, err
		}
		switch {
		case num == sotwRespTypeURL && typ == protowire.BytesType:
			info.typeURL, err = r.String(r.Len())
		case num == sotwRespNonce && typ == protowire.BytesType:
			info.nonce, err = r.String(r.Len())
		default:
			err = r.SkipValue(num, typ, r.Len())
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
	r := wirefields.NewReader(data)
	for !r.Done(r.Len()) {
		num, typ, err := r.Tag(r.Len())
		if err != nil {
			return info, err
		}
		switch {
		case num == deltaRespTypeURL && typ == protowire.BytesType:
			info.typeURL, err = r.String(r.Len())
		case num == deltaRespNonce && typ == protowire.BytesType:
			info.nonce, err = r.String(r.Len())
		case num == deltaRespRemovedResources && typ == protowire.BytesType:
			var name string
			name, err = r.String(r.Len())
			info.removed = append(info.removed, name)
		case num == deltaRespRemovedResourceNames && typ == protowire.BytesType:
			var name string
			name, err = scanResourceName(r, r.Len())
			info.removed = append(info.removed, name)
		case num == deltaRespResources && typ == protowire.BytesType:
			var rv resourceVersionInfo
			rv, err = scanResource(r)
			info.resources = append(info.resources, rv)
		default:
			err = r.SkipValue(num, typ, r.Len())
		}
		if err != nil {
			return info, err
		}
	}
	return info, nil
}

// scanResource reads one length-prefixed Resource: its name and version.
func scanResource(r *wirefields.Reader) (resourceVersionInfo, error) {
	var rv resourceVersionInfo
	end, err := r.Sub(r.Len())
	if err != nil {
		return rv, err
	}
	var name, rnName string
	for !r.Done(end) {
		num, typ, err := r.Tag(end)
		if err != nil {
			return rv, err
		}
		switch {
		case num == resourceName && typ == protowire.BytesType:
			name, err = r.String(end)
		case num == resourceVersion && typ == protowire.BytesType:
			rv.version, err = r.String(end)
		case num == resourceResourceName && typ == protowire.BytesType:
			// Repeated occurrences of a message field merge: a later name
			// replaces an earlier one only where it appears.
			rnName, err = mergeResourceName(r, end, rnName)
		default:
			err = r.SkipValue(num, typ, end)
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

// scanResourceName reads one length-prefixed ResourceName and returns its name.
func scanResourceName(r *wirefields.Reader, limit int) (string, error) {
	return mergeResourceName(r, limit, "")
}

func mergeResourceName(r *wirefields.Reader, limit int, name string) (string, error) {
	end, err := r.Sub(limit)
	if err != nil {
		return "", err
	}
	for !r.Done(end) {
		num, typ, err := r.Tag(end)
		if err != nil {
			return "", err
		}
		if num == resourceNameName && typ == protowire.BytesType {
			name, err = r.String(end)
		} else {
			err = r.SkipValue(num, typ, end)
		}
		if err != nil {
			return "", err
		}
	}
	return name, nil
}

package sds

import (
	"fmt"
	"unicode/utf8"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meshagent/meshagent/internal/wirefields"
)

// wireRequest receives a StreamSecrets request (a udsserver.WireDecoder). It
// reads the fields the server acts on straight from the wire: version_info,
// resource_names, type_url, response_nonce and error_detail's code and
// message. The node, error_detail's details and resource_locators are
// skipped, never decoded: the server does not use them, and Envoy sends a
// node with its metadata in every stream's first request. Otherwise it
// decodes as protobuf does: the last of a repeated singular field wins,
// fields of an unexpected wire type are skipped, and strings must be UTF-8.
// Every ACK goes through here, so it is also the cheaper path per request.
//
// A stream decodes every request into the same wireRequest: its type URL and
// resource names, unchanged in an ACK, reuse the previous request's strings
// instead of allocating them again.
type wireRequest struct {
	req *discoveryv3.DiscoveryRequest
}

// DiscoveryRequest field numbers (envoy.service.discovery.v3).
const (
	reqVersionInfo   protowire.Number = 1
	reqResourceNames protowire.Number = 3
	reqTypeURL       protowire.Number = 4
	reqResponseNonce protowire.Number = 5
	reqErrorDetail   protowire.Number = 6
)

// google.rpc.Status field numbers.
const (
	statusCode    protowire.Number = 1
	statusMessage protowire.Number = 2
)

func (w *wireRequest) DecodeWire(b []byte) error {
	prev := w.req
	req := &discoveryv3.DiscoveryRequest{}
	var names [][]byte
	err := wirefields.Walk(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		var err error
		switch num {
		case reqVersionInfo:
			req.VersionInfo, err = utf8String(v, "version_info")
		case reqResourceNames:
			names = append(names, v)
		case reqTypeURL:
			if prev != nil && string(v) == prev.TypeUrl {
				req.TypeUrl = prev.TypeUrl
			} else {
				req.TypeUrl, err = utf8String(v, "type_url")
			}
		case reqResponseNonce:
			req.ResponseNonce, err = utf8String(v, "response_nonce")
		case reqErrorDetail:
			if req.ErrorDetail == nil {
				req.ErrorDetail = &rpcstatus.Status{}
			}
			err = decodeStatus(v, req.ErrorDetail)
		}
		return err
	})
	if err == nil {
		req.ResourceNames, err = resourceNames(names, prev)
	}
	if err != nil {
		return fmt.Errorf("decoding DiscoveryRequest: %w", err)
	}
	w.req = req
	return nil
}

// resourceNames turns the names read into strings, or returns the previous
// request's when they are the same.
func resourceNames(names [][]byte, prev *discoveryv3.DiscoveryRequest) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	if prev != nil && len(prev.ResourceNames) == len(names) {
		same := true
		for i, n := range names {
			if string(n) != prev.ResourceNames[i] {
				same = false
				break
			}
		}
		if same {
			return prev.ResourceNames, nil
		}
	}
	out := make([]string, len(names))
	for i, n := range names {
		var err error
		if out[i], err = utf8String(n, "resource_names"); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// decodeStatus merges the code and message of a google.rpc.Status into st.
func decodeStatus(b []byte, st *rpcstatus.Status) error {
	return wirefields.Walk(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch {
		case num == statusCode && typ == protowire.VarintType:
			code, _ := protowire.ConsumeVarint(v) // Walk checked it
			st.Code = int32(code)
		case num == statusMessage && typ == protowire.BytesType:
			var err error
			st.Message, err = utf8String(v, "error_detail.message")
			return err
		}
		return nil
	})
}

func utf8String(b []byte, field string) (string, error) {
	if !utf8.Valid(b) {
		return "", fmt.Errorf("%s is not valid UTF-8", field)
	}
	return string(b), nil
}

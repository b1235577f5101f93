package sds

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// withoutSkipped is req without the fields wireRequest does not read.
func withoutSkipped(req *discoveryv3.DiscoveryRequest) *discoveryv3.DiscoveryRequest {
	out := proto.Clone(req).(*discoveryv3.DiscoveryRequest)
	out.Node = nil
	out.ResourceLocators = nil
	if out.ErrorDetail != nil {
		out.ErrorDetail.Details = nil
	}
	out.ProtoReflect().SetUnknown(nil)
	if out.ErrorDetail != nil {
		out.ErrorDetail.ProtoReflect().SetUnknown(nil)
	}
	return out
}

func TestWireRequestDecodesAsProtobuf(t *testing.T) {
	meta, _ := structpb.NewStruct(map[string]any{"ISTIO_VERSION": "1.28.0", "LABELS": map[string]any{"app": "x"}})
	detail, _ := anypb.New(&corev3.Node{Id: "x"})
	reqs := []*discoveryv3.DiscoveryRequest{
		{},
		{TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default", "ROOTCA"},
			Node: &corev3.Node{Id: "sidecar~10.0.0.1~a.b~b.svc.cluster.local", Metadata: meta}},
		{VersionInfo: "2026-11-23T10:00:00Z/4", ResponseNonce: "12", TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default"}},
		{ResponseNonce: "3", ErrorDetail: &rpcstatus.Status{Code: 13, Message: "bad secret", Details: []*anypb.Any{detail}}},
		{ErrorDetail: &rpcstatus.Status{}},
	}
	for _, r := range reqs {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var w wireRequest
		if err := w.DecodeWire(b); err != nil {
			t.Fatalf("%v: %v", r, err)
		}
		if want := withoutSkipped(r); !proto.Equal(w.req, want) {
			t.Errorf("decoded %v, want %v", w.req, want)
		}
	}
}

func TestWireRequestRefusesWhatProtobufRefuses(t *testing.T) {
	for name, b := range map[string][]byte{
		"truncated length":   {0x1a, 0x05, 'a'},
		"invalid UTF-8 name": {0x1a, 0x01, 0xff},
		"field number zero":  {0x02, 0x00},
		"bad status message": {0x32, 0x03, 0x12, 0x01, 0xff},
	} {
		var w wireRequest
		if err := w.DecodeWire(b); err == nil {
			t.Errorf("%s: decoded %v", name, w.req)
		}
		if err := proto.Unmarshal(b, &discoveryv3.DiscoveryRequest{}); err == nil {
			t.Errorf("%s: protobuf accepts it too; the case tests nothing", name)
		}
	}
}

// FuzzWireRequest: whatever protobuf decodes, wireRequest decodes to the same
// fields; nothing panics.
func FuzzWireRequest(f *testing.F) {
	for _, r := range []*discoveryv3.DiscoveryRequest{
		{TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default"}, Node: &corev3.Node{Id: "n"}},
		{VersionInfo: "v", ResponseNonce: "n1", ResourceNames: []string{"ROOTCA", "default"}},
		{ErrorDetail: &rpcstatus.Status{Code: 3, Message: "m"}},
	} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	prev, _ := proto.Marshal(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default", "ROOTCA"}})
	f.Fuzz(func(t *testing.T, b []byte) {
		// After another request on the same stream, whose strings it may
		// reuse.
		var w wireRequest
		if err := w.DecodeWire(prev); err != nil {
			t.Fatal(err)
		}
		werr := w.DecodeWire(b)
		var req discoveryv3.DiscoveryRequest
		if proto.Unmarshal(b, &req) != nil {
			return // wireRequest may accept what it skips (a malformed node)
		}
		if werr != nil {
			t.Fatalf("protobuf decodes %v, wireRequest fails: %v", &req, werr)
		}
		if want := withoutSkipped(&req); !proto.Equal(w.req, want) {
			t.Fatalf("decoded %v, want %v", w.req, want)
		}
	})
}

// An ACK's unchanged type URL and names reuse the previous request's
// strings; changed names do not.
func TestWireRequestReusesUnchangedStrings(t *testing.T) {
	enc := func(r *discoveryv3.DiscoveryRequest) []byte {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var w wireRequest
	if err := w.DecodeWire(enc(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default"}})); err != nil {
		t.Fatal(err)
	}
	first := w.req
	if err := w.DecodeWire(enc(&discoveryv3.DiscoveryRequest{VersionInfo: "v1", ResponseNonce: "n1", TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default"}})); err != nil {
		t.Fatal(err)
	}
	if &w.req.ResourceNames[0] != &first.ResourceNames[0] || w.req.VersionInfo != "v1" || w.req.ResponseNonce != "n1" {
		t.Errorf("ACK decoded as %v; names not reused", w.req)
	}
	if err := w.DecodeWire(enc(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: []string{"ROOTCA"}})); err != nil {
		t.Fatal(err)
	}
	if len(w.req.ResourceNames) != 1 || w.req.ResourceNames[0] != "ROOTCA" || first.ResourceNames[0] != "default" {
		t.Errorf("changed names decoded as %v (first request now %v)", w.req.ResourceNames, first.ResourceNames)
	}
	if err := w.DecodeWire(enc(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType})); err != nil || w.req.ResourceNames != nil {
		t.Errorf("no names decoded as %v, %v", w.req.ResourceNames, err)
	}
}

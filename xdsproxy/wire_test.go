package xdsproxy

import (
	"errors"
	"slices"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

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

// sampleSotwResponse carries a resource of payload bytes. Fuzz seeds keep
// it small: the fuzzer's minimizer is quadratic in the input size.
func sampleSotwResponse(t testing.TB, payload int) []byte {
	t.Helper()
	big := make([]byte, payload)
	return mustMarshal(t, &discovery.DiscoveryResponse{
		VersionInfo: "2026-01-01T00:00:00Z/7",
		TypeUrl:     resource.ClusterType,
		Nonce:       "nonce-42",
		Resources: []*anypb.Any{
			{TypeUrl: resource.ClusterType, Value: big},
			{TypeUrl: resource.ClusterType, Value: []byte("x")},
		},
	})
}

func sampleDeltaResponse(t testing.TB, payload int) []byte {
	t.Helper()
	return mustMarshal(t, &discovery.DeltaDiscoveryResponse{
		SystemVersionInfo: "sys-1",
		TypeUrl:           resource.EndpointType,
		Nonce:             "n-9",
		Resources: []*discovery.Resource{
			{Name: "a", Version: "1", Resource: &anypb.Any{Value: make([]byte, payload)}, Aliases: []string{"al"}},
			{ResourceName: &discovery.ResourceName{Name: "b"}, Version: "2"},
			{Name: "c", Version: "3", ResourceName: &discovery.ResourceName{Name: "ignored"}},
		},
		RemovedResources:     []string{"d"},
		RemovedResourceNames: []*discovery.ResourceName{{Name: "e"}},
	})
}

func TestScanSotwResponse(t *testing.T) {
	b := sampleSotwResponse(t, 5000)
	for _, n := range []int{1, 2, 3, 7, 100, len(b)} {
		info, err := scanSotwResponse(chunked(b, n))
		if err != nil {
			t.Fatalf("chunks of %d: %v", n, err)
		}
		if info.typeURL != resource.ClusterType || info.nonce != "nonce-42" {
			t.Fatalf("chunks of %d: %+v", n, info)
		}
	}
	// Every truncation is an error, never a panic.
	for i := 1; i < len(b); i += 97 {
		if _, err := scanSotwResponse(chunked(b[:i], 13)); !errors.Is(err, errMalformed) {
			t.Fatalf("truncated at %d: err = %v", i, err)
		}
	}
}

func TestScanDeltaResponse(t *testing.T) {
	b := sampleDeltaResponse(t, 3000)
	want := deltaResponseInfo{
		typeURL:   resource.EndpointType,
		nonce:     "n-9",
		resources: []resourceVersionInfo{{"a", "1"}, {"b", "2"}, {"c", "3"}},
		removed:   []string{"d", "e"},
	}
	for _, n := range []int{1, 5, 64, len(b)} {
		info, err := scanDeltaResponse(chunked(b, n))
		if err != nil {
			t.Fatalf("chunks of %d: %v", n, err)
		}
		slices.Sort(info.removed)
		if info.typeURL != want.typeURL || info.nonce != want.nonce ||
			!slices.Equal(info.resources, want.resources) || !slices.Equal(info.removed, want.removed) {
			t.Fatalf("chunks of %d: %+v, want %+v", n, info, want)
		}
	}
}

func TestScanRejectsMalformed(t *testing.T) {
	tests := []struct {
		name      string
		b         []byte
		deltaOnly bool // SotW skips resources whole
	}{
		{"length past the end", []byte{0x22, 0x05, 'a'}, false},
		{"field number zero", []byte{0x02, 0x00}, false},
		{"varint too long", []byte{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, false},
		{"end group at top level", []byte{0x0c}, false},
		{"unterminated group", []byte{0x0b, 0x08, 0x01}, false},
		{"bad wire type", []byte{0x0f}, false},
		{"resource field runs past the resource", protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), []byte{0x1a, 0x09, 'x'}), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := scanSotwResponse(chunked(tt.b, 2)); !tt.deltaOnly && !errors.Is(err, errMalformed) {
				t.Errorf("sotw: err = %v", err)
			}
			if _, err := scanDeltaResponse(chunked(tt.b, 2)); !errors.Is(err, errMalformed) {
				t.Errorf("delta: err = %v", err)
			}
			if proto.Unmarshal(tt.b, &discovery.DeltaDiscoveryResponse{}) == nil {
				t.Errorf("protobuf accepts it")
			}
		})
	}
}

// The scanners must agree with the protobuf library on every message it
// accepts, wherever the buffer boundaries fall, and never panic.
func FuzzScanSotwResponse(f *testing.F) {
	f.Add(sampleSotwResponse(f, 8), uint8(3))
	f.Add(sampleDeltaResponse(f, 8), uint8(0))
	f.Add([]byte{0x2a, 0x01, 'n', 0x2a, 0x01, 'm'}, uint8(1))
	f.Add([]byte{0x0b, 0x2a, 0x01, 'n', 0x0c}, uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8) {
		info, err := scanSotwResponse(chunked(b, int(chunk)+1))
		var resp discovery.DiscoveryResponse
		if proto.Unmarshal(b, &resp) != nil {
			return
		}
		if err != nil {
			t.Fatalf("protobuf accepts what the scanner rejects: %v", err)
		}
		if info.typeURL != resp.TypeUrl || info.nonce != resp.Nonce {
			t.Fatalf("scanner %+v, protobuf type %q nonce %q", info, resp.TypeUrl, resp.Nonce)
		}
	})
}

func FuzzScanDeltaResponse(f *testing.F) {
	f.Add(sampleDeltaResponse(f, 8), uint8(4))
	f.Add(sampleSotwResponse(f, 8), uint8(0))
	f.Add(mustMarshal(f, &discovery.DeltaDiscoveryResponse{Resources: []*discovery.Resource{
		{ResourceName: &discovery.ResourceName{Name: "x"}},
	}}), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8) {
		info, err := scanDeltaResponse(chunked(b, int(chunk)+1))
		var resp discovery.DeltaDiscoveryResponse
		if proto.Unmarshal(b, &resp) != nil {
			return
		}
		if err != nil {
			t.Fatalf("protobuf accepts what the scanner rejects: %v", err)
		}
		var want []resourceVersionInfo
		for _, r := range resp.Resources {
			name := r.Name
			if name == "" {
				name = r.GetResourceName().GetName()
			}
			want = append(want, resourceVersionInfo{name, r.Version})
		}
		removed := slices.Clone(resp.RemovedResources)
		for _, r := range resp.RemovedResourceNames {
			removed = append(removed, r.GetName())
		}
		slices.Sort(removed)
		slices.Sort(info.removed)
		if info.typeURL != resp.TypeUrl || info.nonce != resp.Nonce ||
			!slices.Equal(info.resources, want) || !slices.Equal(info.removed, removed) {
			t.Fatalf("scanner %+v, protobuf %v", info, &resp)
		}
	})
}

// Any bytes from a client give a verdict or an error, never a panic.
func FuzzTrackerRequest(f *testing.F) {
	f.Add(mustMarshal(f, &discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: "1"}), true)
	f.Add(mustMarshal(f, &discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}}), false)
	f.Add([]byte{0xff}, true)
	f.Fuzz(func(t *testing.T, b []byte, sotw bool) {
		var tr tracker = newDeltaTracker()
		if sotw {
			tr = newSotwTracker()
		}
		for gen := uint64(1); gen <= 2; gen++ {
			v, out, err := tr.request(b, gen)
			if err == nil && v == rewrite && out == nil {
				t.Fatal("rewrite without a request")
			}
			if _, err := tr.resubscribe(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

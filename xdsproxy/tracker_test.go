package xdsproxy

import (
	"maps"
	"slices"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func sotwRequest(t *testing.T, tr tracker, gen uint64, req *discovery.DiscoveryRequest) (verdict, *discovery.DiscoveryRequest) {
	t.Helper()
	v, out, err := tr.request(mustMarshal(t, req), gen)
	if err != nil {
		t.Fatal(err)
	}
	var got *discovery.DiscoveryRequest
	if out != nil {
		got = &discovery.DiscoveryRequest{}
		if err := proto.Unmarshal(out, got); err != nil {
			t.Fatal(err)
		}
	}
	return v, got
}

func sotwResponse(t *testing.T, tr tracker, gen uint64, typeURL, version, nonce string) {
	t.Helper()
	b := mustMarshal(t, &discovery.DiscoveryResponse{TypeUrl: typeURL, VersionInfo: version, Nonce: nonce})
	if err := tr.response(chunked(b, 4), gen); err != nil {
		t.Fatal(err)
	}
}

func resubscribeSotw(t *testing.T, tr tracker) []*discovery.DiscoveryRequest {
	t.Helper()
	raw, err := tr.resubscribe()
	if err != nil {
		t.Fatal(err)
	}
	var out []*discovery.DiscoveryRequest
	for _, b := range raw {
		req := &discovery.DiscoveryRequest{}
		if err := proto.Unmarshal(b, req); err != nil {
			t.Fatal(err)
		}
		out = append(out, req)
	}
	return out
}

func TestSotwTrackerResubscribes(t *testing.T) {
	tr := newSotwTracker()
	node := testNode()
	steps := []*discovery.DiscoveryRequest{
		{Node: node, TypeUrl: resource.ClusterType},
		{TypeUrl: resource.EndpointType, ResourceNames: []string{"a", "b"}},
		{TypeUrl: resource.RouteType, ResourceNames: []string{"r"}},
		{TypeUrl: resource.ListenerType},
	}
	for _, req := range steps {
		if v, _ := sotwRequest(t, tr, 1, req); v != forward {
			t.Fatalf("first request verdict %v", v)
		}
	}
	sotwResponse(t, tr, 1, resource.ClusterType, "c7", "1")
	sotwResponse(t, tr, 1, resource.EndpointType, "e3", "2")
	sotwRequest(t, tr, 1, &discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "c7", ResponseNonce: "1"})
	// A NACK keeps the version the client still runs.
	sotwRequest(t, tr, 1, &discovery.DiscoveryRequest{
		TypeUrl: resource.EndpointType, ResourceNames: []string{"a", "b"}, VersionInfo: "e2", ResponseNonce: "2",
		ErrorDetail: &status.Status{Message: "rejected"},
	})
	// The routes were unsubscribed: nothing to restore.
	sotwRequest(t, tr, 1, &discovery.DiscoveryRequest{TypeUrl: resource.RouteType})

	got := resubscribeSotw(t, tr)
	want := []*discovery.DiscoveryRequest{
		{Node: node, TypeUrl: resource.ClusterType, VersionInfo: "c7"},
		{TypeUrl: resource.EndpointType, ResourceNames: []string{"a", "b"}, VersionInfo: "e2"},
		{TypeUrl: resource.ListenerType},
	}
	if len(got) != len(want) {
		t.Fatalf("resubscribe = %v", got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("resubscribe[%d] = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestSotwTrackerAnswersToALostStream(t *testing.T) {
	tr := newSotwTracker()
	sotwRequest(t, tr, 1, &discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.EndpointType, ResourceNames: []string{"a"}})
	sotwResponse(t, tr, 1, resource.EndpointType, "v1", "5")
	sotwResponse(t, tr, 1, resource.EndpointType, "v2", "6")
	// Upstream stream 2 begins; it has sent nothing yet.
	resubscribeSotw(t, tr)

	// The client ACKs the old stream's responses: nothing to forward.
	if v, _ := sotwRequest(t, tr, 2, &discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"a"}, VersionInfo: "v1", ResponseNonce: "5"}); v != drop {
		t.Fatalf("stale ACK verdict %v, want drop", v)
	}
	// A change of names answering an old response is forwarded without
	// the unknown nonce.
	v, got := sotwRequest(t, tr, 2, &discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"a", "b"}, VersionInfo: "v2", ResponseNonce: "6"})
	if v != rewrite || got.ResponseNonce != "" || !slices.Equal(got.ResourceNames, []string{"a", "b"}) || got.VersionInfo != "v2" {
		t.Fatalf("stale change: %v %v", v, got)
	}
	// Stream 2 answers; its nonces repeat stream 1's, which must not
	// confuse the proxy.
	sotwResponse(t, tr, 2, resource.EndpointType, "v3", "5")
	if v, _ := sotwRequest(t, tr, 2, &discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"a", "b"}, VersionInfo: "v3", ResponseNonce: "5"}); v != forward {
		t.Fatalf("current ACK verdict %v, want forward", v)
	}
	sotwResponse(t, tr, 2, resource.EndpointType, "v4", "6")
	sotwResponse(t, tr, 3, resource.EndpointType, "v5", "1") // stream 3
	v, got = sotwRequest(t, tr, 3, &discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"c"}, VersionInfo: "v4", ResponseNonce: "6"})
	if v != rewrite || got.ResponseNonce != "1" {
		t.Fatalf("stale change after stream 3 answered: %v %v, want the nonce of its newest response", v, got)
	}
	// Unknown nonces are the upstream's business.
	if v, _ := sotwRequest(t, tr, 3, &discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"c"}, ResponseNonce: "zzz"}); v != forward {
		t.Fatalf("unknown nonce verdict %v, want forward", v)
	}
}

func TestTrackerRejectsBadRequests(t *testing.T) {
	for _, tr := range []tracker{newSotwTracker(), newDeltaTracker()} {
		if _, _, err := tr.request([]byte{0x0a, 0x05}, 1); err == nil {
			t.Error("truncated request accepted")
		}
		if _, _, err := tr.request(nil, 1); err != errNoTypeURL {
			t.Errorf("empty request: %v", err)
		}
		for i := range maxTypes {
			b := mustMarshal(t, &discovery.DiscoveryRequest{TypeUrl: "type-" + itoa(i)})
			if _, ok := tr.(*deltaTracker); ok {
				b = mustMarshal(t, &discovery.DeltaDiscoveryRequest{TypeUrl: "type-" + itoa(i)})
			}
			if _, _, err := tr.request(b, 1); err != nil {
				t.Fatal(err)
			}
		}
		b := mustMarshal(t, &discovery.DiscoveryRequest{TypeUrl: "one-too-many"})
		if _, ok := tr.(*deltaTracker); ok {
			b = mustMarshal(t, &discovery.DeltaDiscoveryRequest{TypeUrl: "one-too-many"})
		}
		if _, _, err := tr.request(b, 1); err != errTooManyTypes {
			t.Errorf("type %d: %v", maxTypes+1, err)
		}
	}
}

func deltaReq(t *testing.T, tr tracker, gen uint64, req *discovery.DeltaDiscoveryRequest) (verdict, *discovery.DeltaDiscoveryRequest) {
	t.Helper()
	v, out, err := tr.request(mustMarshal(t, req), gen)
	if err != nil {
		t.Fatal(err)
	}
	var got *discovery.DeltaDiscoveryRequest
	if out != nil {
		got = &discovery.DeltaDiscoveryRequest{}
		if err := proto.Unmarshal(out, got); err != nil {
			t.Fatal(err)
		}
	}
	return v, got
}

func deltaResp(t *testing.T, tr tracker, gen uint64, resp *discovery.DeltaDiscoveryResponse) {
	t.Helper()
	if err := tr.response(chunked(mustMarshal(t, resp), 3), gen); err != nil {
		t.Fatal(err)
	}
}

func resubscribeDelta(t *testing.T, tr tracker) []*discovery.DeltaDiscoveryRequest {
	t.Helper()
	raw, err := tr.resubscribe()
	if err != nil {
		t.Fatal(err)
	}
	var out []*discovery.DeltaDiscoveryRequest
	for _, b := range raw {
		req := &discovery.DeltaDiscoveryRequest{}
		if err := proto.Unmarshal(b, req); err != nil {
			t.Fatal(err)
		}
		out = append(out, req)
	}
	return out
}

func res(name, version string) *discovery.Resource {
	return &discovery.Resource{Name: name, Version: version, Resource: &anypb.Any{}}
}

func TestDeltaTrackerFollowsAcknowledgedVersions(t *testing.T) {
	tr := newDeltaTracker()
	node := testNode()
	eds := resource.EndpointType
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ClusterType})
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{
		TypeUrl: eds, ResourceNamesSubscribe: []string{"a", "b", "c"},
		InitialResourceVersions: map[string]string{"c": "c0"},
	})
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResourceNamesSubscribe: []string{"r"}})

	deltaResp(t, tr, 1, &discovery.DeltaDiscoveryResponse{TypeUrl: resource.ClusterType, Nonce: "1", Resources: []*discovery.Resource{res("x", "x1")}})
	deltaResp(t, tr, 1, &discovery.DeltaDiscoveryResponse{TypeUrl: eds, Nonce: "2", Resources: []*discovery.Resource{res("a", "a1"), res("b", "b1")}})
	deltaResp(t, tr, 1, &discovery.DeltaDiscoveryResponse{TypeUrl: eds, Nonce: "3", Resources: []*discovery.Resource{res("a", "a2")}, RemovedResources: []string{"c"}})
	deltaResp(t, tr, 1, &discovery.DeltaDiscoveryResponse{TypeUrl: eds, Nonce: "4", Resources: []*discovery.Resource{res("b", "b9")}})

	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: "1"})
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: "2"})
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: "3"})
	// A NACK: the client did not take b9.
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: "4", ErrorDetail: &status.Status{Message: "no"}})
	// Unsubscribing drops the version too; the route type is now empty.
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesUnsubscribe: []string{"b"}})
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResourceNamesUnsubscribe: []string{"r"}})

	got := resubscribeDelta(t, tr)
	want := []*discovery.DeltaDiscoveryRequest{
		{Node: node, TypeUrl: resource.ClusterType, InitialResourceVersions: map[string]string{"x": "x1"}},
		{TypeUrl: eds, ResourceNamesSubscribe: []string{"a", "c"}, InitialResourceVersions: map[string]string{"a": "a2"}},
	}
	if len(got) != len(want) {
		t.Fatalf("resubscribe = %v", got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("resubscribe[%d] = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestDeltaTrackerWildcards(t *testing.T) {
	tr := newDeltaTracker()
	cds, lds := resource.ClusterType, resource.ListenerType
	// Legacy wildcard, then a named resource: still wildcard, now explicit.
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: cds})
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: cds, ResourceNamesSubscribe: []string{"extra"}})
	// Explicit wildcard, then unsubscribed.
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: lds, ResourceNamesSubscribe: []string{"*", "l1"}})
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: lds, ResourceNamesUnsubscribe: []string{"*"}})
	deltaResp(t, tr, 1, &discovery.DeltaDiscoveryResponse{TypeUrl: lds, Nonce: "n", Resources: []*discovery.Resource{res("l1", "1"), res("l2", "1")}})
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: lds, ResponseNonce: "n"})

	got := resubscribeDelta(t, tr)
	if len(got) != 2 {
		t.Fatalf("resubscribe = %v", got)
	}
	if s := got[0].ResourceNamesSubscribe; !slices.Equal(s, []string{"extra", "*"}) {
		t.Errorf("cds subscribe = %v", s)
	}
	if s := got[1].ResourceNamesSubscribe; !slices.Equal(s, []string{"l1"}) {
		t.Errorf("lds subscribe = %v", s)
	}
	// l2 came in but is no longer subscribed: not claimed.
	if v := got[1].InitialResourceVersions; !maps.Equal(v, map[string]string{"l1": "1"}) {
		t.Errorf("lds initial versions = %v", v)
	}

	legacy := newDeltaTracker()
	deltaReq(t, legacy, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: cds})
	if got := resubscribeDelta(t, legacy); len(got) != 1 || len(got[0].ResourceNamesSubscribe) != 0 {
		t.Errorf("legacy wildcard resubscribe = %v, want an empty list", got)
	}
}

func TestDeltaTrackerAnswersToALostStream(t *testing.T) {
	tr := newDeltaTracker()
	eds := resource.EndpointType
	deltaReq(t, tr, 1, &discovery.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{"a"}})
	deltaResp(t, tr, 1, &discovery.DeltaDiscoveryResponse{TypeUrl: eds, Nonce: "1", Resources: []*discovery.Resource{res("a", "a1")}})
	resubscribeDelta(t, tr)
	// The late ACK of the old stream's response still counts for versions.
	if v, _ := deltaReq(t, tr, 2, &discovery.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: "1"}); v != drop {
		t.Fatalf("stale ACK verdict %v", v)
	}
	if got := resubscribeDelta(t, tr); got[0].InitialResourceVersions["a"] != "a1" {
		t.Fatalf("late ACK not recorded: %v", got)
	}
	deltaResp(t, tr, 2, &discovery.DeltaDiscoveryResponse{TypeUrl: eds, Nonce: "1"})
	deltaResp(t, tr, 3, &discovery.DeltaDiscoveryResponse{TypeUrl: eds, Nonce: "7"})
	v, got := deltaReq(t, tr, 3, &discovery.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{"b"}, ResponseNonce: "1"})
	if v != rewrite || got.ResponseNonce != "7" || !slices.Equal(got.ResourceNamesSubscribe, []string{"b"}) {
		t.Fatalf("stale subscribe: %v %v", v, got)
	}
}

func TestResponseLogIsBounded(t *testing.T) {
	var l responseLog
	for i := range 3 * maxUnanswered {
		l.add(sentResponse{gen: 1, nonce: itoa(i)})
	}
	if len(l.sent) != maxUnanswered {
		t.Fatalf("%d entries kept", len(l.sent))
	}
	if _, ok := l.answer("0"); ok {
		t.Error("the oldest entry was kept")
	}
	if _, ok := l.answer(itoa(3*maxUnanswered - 1)); !ok || len(l.sent) != 0 {
		t.Error("answering the newest should clear the log")
	}
}

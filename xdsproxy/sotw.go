package xdsproxy

import (
	"fmt"
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// sotwTracker follows a state-of-the-world ADS stream.
type sotwTracker struct {
	node  *core.Node
	order []string // type URLs in the order the client first asked for them
	subs  map[string]*sotwSub
	logs  responseLogs
}

// sotwSub is the client's subscription to one type.
type sotwSub struct {
	// names is the resource_names list of the client's latest request.
	names []string
	// legacy is true while the client has only ever sent an empty list
	// (a legacy wildcard subscription).
	legacy bool
	// version is the version_info of the client's latest request: the
	// version it has applied (an ACK carries the new one, a NACK the old).
	version string
	// nonce is the response_nonce of the client's latest request.
	nonce string
}

func newSotwTracker() *sotwTracker {
	return &sotwTracker{subs: map[string]*sotwSub{}, logs: responseLogs{}}
}

func (t *sotwTracker) request(raw []byte, gen uint64) (verdict, []byte, error) {
	var req discovery.DiscoveryRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		return 0, nil, fmt.Errorf("decoding DiscoveryRequest: %w", err)
	}
	if req.TypeUrl == "" {
		return 0, nil, errNoTypeURL
	}
	if t.node == nil && req.Node != nil {
		t.node = req.Node
	}
	l, err := t.logs.get(req.TypeUrl)
	if err != nil {
		return 0, nil, err
	}
	sub, ok := t.subs[req.TypeUrl]
	if !ok {
		sub = &sotwSub{legacy: true}
		t.subs[req.TypeUrl] = sub
		t.order = append(t.order, req.TypeUrl)
	}
	changed := !ok || !sameNames(sub.names, req.ResourceNames)
	sub.names = req.ResourceNames
	if len(req.ResourceNames) > 0 {
		sub.legacy = false
	}
	sub.version = req.VersionInfo
	sub.nonce = req.ResponseNonce

	_, _, stale := l.staleness(req.ResponseNonce, gen)
	if !stale {
		return forward, nil, nil
	}
	if !changed {
		return drop, nil, nil
	}
	// A subscription change that answers an old stream's response: the
	// current upstream would ignore the old nonce, so present it as an
	// answer to the newest response of this stream (or as a first request).
	req.ResponseNonce = l.latest(gen)
	req.ErrorDetail = nil
	out, err := proto.Marshal(&req)
	if err != nil {
		return 0, nil, fmt.Errorf("encoding DiscoveryRequest: %w", err)
	}
	return rewrite, out, nil
}

func (t *sotwTracker) response(data mem.BufferSlice, gen uint64) error {
	info, err := scanSotwResponse(data)
	if err != nil {
		return err
	}
	l, err := t.logs.get(info.typeURL)
	if err != nil {
		return err
	}
	l.add(sentResponse{gen: gen, nonce: info.nonce})
	return nil
}

func (t *sotwTracker) resubscribe() ([][]byte, error) {
	var out [][]byte
	for _, typeURL := range t.order {
		sub := t.subs[typeURL]
		if len(sub.names) == 0 && !sub.legacy {
			continue // the client unsubscribed from everything of this type
		}
		req := &discovery.DiscoveryRequest{
			TypeUrl:       typeURL,
			ResourceNames: sub.names,
			VersionInfo:   sub.version,
		}
		if len(out) == 0 {
			req.Node = t.node
		}
		b, err := proto.Marshal(req)
		if err != nil {
			return nil, fmt.Errorf("encoding DiscoveryRequest: %w", err)
		}
		out = append(out, b)
	}
	return out, nil
}

// sameNames compares resource name lists as sets.
func sameNames(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

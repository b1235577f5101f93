package xdsproxy

import (
	"fmt"
	"maps"
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// wildcardName is the explicit wildcard subscription.
const wildcardName = "*"

// deltaTracker follows an incremental (delta) ADS stream. Besides the
// subscriptions it keeps the version of every resource the client has
// acknowledged, so a new upstream stream can be told what the client already
// holds (initial_resource_versions) and need not send it again.
type deltaTracker struct {
	node  *core.Node
	order []string
	subs  map[string]*deltaSub
	logs  responseLogs
}

// deltaSub is the client's subscription to one type.
type deltaSub struct {
	// names are the explicitly subscribed resource names ("*" excluded).
	names map[string]struct{}
	// wildcard is set by a legacy (empty) first request or an explicit "*",
	// and cleared only by unsubscribing "*".
	wildcard bool
	// legacy is true while the wildcard comes only from an empty first
	// request and no name has been subscribed since.
	legacy bool
	// versions are the resources the client holds, by name.
	versions map[string]string
}

func newDeltaTracker() *deltaTracker {
	return &deltaTracker{subs: map[string]*deltaSub{}, logs: responseLogs{}}
}

func (t *deltaTracker) request(raw []byte, gen uint64) (verdict, []byte, error) {
	var req discovery.DeltaDiscoveryRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		return 0, nil, fmt.Errorf("decoding DeltaDiscoveryRequest: %w", err)
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
		sub = &deltaSub{names: map[string]struct{}{}, versions: map[string]string{}}
		if len(req.ResourceNamesSubscribe) == 0 {
			sub.wildcard, sub.legacy = true, true
		}
		maps.Copy(sub.versions, req.InitialResourceVersions)
		t.subs[req.TypeUrl] = sub
		t.order = append(t.order, req.TypeUrl)
	}
	for _, n := range req.ResourceNamesSubscribe {
		if n == wildcardName {
			sub.wildcard = true
		} else {
			sub.names[n] = struct{}{}
		}
		sub.legacy = false
	}
	for _, n := range req.ResourceNamesUnsubscribe {
		if n == wildcardName {
			sub.wildcard, sub.legacy = false, false
			continue
		}
		delete(sub.names, n)
		delete(sub.versions, n)
	}
	changed := len(req.ResourceNamesSubscribe) > 0 || len(req.ResourceNamesUnsubscribe) > 0

	entry, found, stale := l.staleness(req.ResponseNonce, gen)
	if found && req.ErrorDetail == nil {
		// An ACK: the client now holds what that response carried.
		for _, r := range entry.changed {
			sub.versions[r.name] = r.version
		}
		for _, n := range entry.removed {
			delete(sub.versions, n)
		}
	}
	if !stale {
		return forward, nil, nil
	}
	if !changed {
		return drop, nil, nil
	}
	req.ResponseNonce = l.latest(gen)
	req.ErrorDetail = nil
	out, err := proto.Marshal(&req)
	if err != nil {
		return 0, nil, fmt.Errorf("encoding DeltaDiscoveryRequest: %w", err)
	}
	return rewrite, out, nil
}

func (t *deltaTracker) response(data mem.BufferSlice, gen uint64) error {
	info, err := scanDeltaResponse(data)
	if err != nil {
		return err
	}
	l, err := t.logs.get(info.typeURL)
	if err != nil {
		return err
	}
	l.add(sentResponse{gen: gen, nonce: info.nonce, changed: info.resources, removed: info.removed})
	return nil
}

func (t *deltaTracker) resubscribe() ([][]byte, error) {
	var out [][]byte
	for _, typeURL := range t.order {
		sub := t.subs[typeURL]
		if !sub.wildcard && len(sub.names) == 0 {
			continue // nothing subscribed any more
		}
		req := &discovery.DeltaDiscoveryRequest{
			TypeUrl:                typeURL,
			ResourceNamesSubscribe: slices.Sorted(maps.Keys(sub.names)),
		}
		if sub.wildcard && !sub.legacy {
			req.ResourceNamesSubscribe = append(req.ResourceNamesSubscribe, wildcardName)
		}
		for name, v := range sub.versions {
			if _, named := sub.names[name]; named || sub.wildcard {
				if req.InitialResourceVersions == nil {
					req.InitialResourceVersions = map[string]string{}
				}
				req.InitialResourceVersions[name] = v
			}
		}
		if len(out) == 0 {
			req.Node = t.node
		}
		b, err := proto.Marshal(req)
		if err != nil {
			return nil, fmt.Errorf("encoding DeltaDiscoveryRequest: %w", err)
		}
		out = append(out, b)
	}
	return out, nil
}

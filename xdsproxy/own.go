package xdsproxy

import (
	"fmt"
	"maps"
	"slices"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.uber.org/zap"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/internal/logkeys"
)

// Subscription is a resource type the proxy asks the control plane for on
// its own, on every upstream stream (state of the world or delta), besides
// what the client asks for: pilot-agent's ProxyConfig
// (type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig, which carries the
// mesh's extra roots). The responses of that type are not forwarded to the
// client; the proxy hands them to Apply and ACKs them, or NACKs them with
// Apply's error. The subscription is wildcard (no resource names) and is
// sent again on every new upstream stream with what was last accepted (the
// version; on delta streams, each resource's version).
//
// A client that subscribes to the same type itself does not get its
// responses: the type belongs to the proxy.
type Subscription struct {
	// TypeURL is the resource type. Required.
	TypeURL string
	// Apply receives the resources of each response of the type (on delta
	// streams, every resource held after applying the response, in name
	// order); an error
	// NACKs the response (the previous state stays the caller's business).
	// Called from the upstream streams' goroutines, one response at a time
	// per stream. Required.
	Apply func(resources []*anypb.Any) error
}

// ownSub is the state of one Subscription on one downstream session.
type ownSub struct {
	sub     *Subscription
	version string // the version last accepted, sent again on a new stream
	gen     uint64 // the upstream stream the subscription was last sent on
	// res are the resources last accepted on a delta stream, by name.
	res map[string]*discovery.Resource
}

// ownSubs returns the session's own subscriptions.
func (p *Proxy) ownSubs() []*ownSub {
	out := make([]*ownSub, 0, len(p.cfg.Subscriptions))
	for i := range p.cfg.Subscriptions {
		out = append(out, &ownSub{sub: &p.cfg.Subscriptions[i]})
	}
	return out
}

// subscribeOwn queues the proxy's own subscriptions on the current upstream
// stream once it has carried the client's first request (which names the
// node). s.mu is held and s.up is set.
func (s *session) subscribeOwn() {
	for _, o := range s.own {
		if o.gen == s.gen {
			continue
		}
		b, err := proto.Marshal(s.proto.ownSubscription(o))
		if err != nil {
			s.log.Error("encoding the proxy's own subscription", zap.Error(err))
			continue
		}
		o.gen = s.gen
		s.up.enqueue(bytesFrame(b))
	}
}

// ownResponse handles a response of one of the proxy's own types: applied,
// then ACKed or NACKed on snd's stream, never forwarded. handled is false for
// any other type.
func (s *session) ownResponse(f *frame, snd *sender) (handled bool, err error) {
	typeURL, err := s.proto.responseType(f.data)
	if err != nil {
		return false, err
	}
	var o *ownSub
	for _, c := range s.own {
		if c.sub.TypeURL == typeURL {
			o = c
		}
	}
	if o == nil {
		return false, nil
	}
	a, err := s.proto.applyOwn(o, f.data.Materialize())
	if err != nil {
		return true, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.applyErr != nil {
		s.p.metrics.ownResponses.WithLabelValues(o.sub.TypeURL, "nack").Inc()
		s.log.Warn("NACKed the control plane's response to the proxy's own subscription",
			zap.String(logkeys.TypeURL, o.sub.TypeURL), zap.String(logkeys.Version, a.version), zap.Error(a.applyErr))
	} else {
		s.p.metrics.ownResponses.WithLabelValues(o.sub.TypeURL, "ack").Inc()
		o.version, o.res = a.version, a.res
	}
	b, err := proto.Marshal(a.ack)
	if err != nil {
		return true, fmt.Errorf("encoding the answer to the control plane: %w", err)
	}
	if s.up == snd {
		snd.enqueue(bytesFrame(b))
	}
	return true, nil
}

// ownAnswer is what applying a response to an own subscription gave: the
// ACK or NACK to send, and on success the version and resources now held.
type ownAnswer struct {
	ack      proto.Message
	applyErr error // the subscription refused the resources: ack is a NACK
	version  string
	res      map[string]*discovery.Resource // delta only
}

// sotwOwnSubscription asks for o's type, from the version last accepted.
func sotwOwnSubscription(o *ownSub) proto.Message {
	return &discovery.DiscoveryRequest{TypeUrl: o.sub.TypeURL, VersionInfo: o.version}
}

// deltaOwnSubscription asks for o's type, with the resources held.
func deltaOwnSubscription(o *ownSub) proto.Message {
	versions := make(map[string]string, len(o.res))
	for name, r := range o.res {
		versions[name] = r.GetVersion()
	}
	return &discovery.DeltaDiscoveryRequest{TypeUrl: o.sub.TypeURL, InitialResourceVersions: versions}
}

func sotwResponseType(data mem.BufferSlice) (string, error) {
	info, err := scanSotwResponse(data)
	return info.typeURL, err
}

func deltaResponseType(data mem.BufferSlice) (string, error) {
	info, err := scanDeltaResponse(data)
	return info.typeURL, err
}

// sotwApplyOwn applies a DiscoveryResponse (every resource of the type) to
// o; the ACK carries the new version, a NACK the one held.
func sotwApplyOwn(o *ownSub, data []byte) (ownAnswer, error) {
	var resp discovery.DiscoveryResponse
	if err := proto.Unmarshal(data, &resp); err != nil {
		return ownAnswer{}, fmt.Errorf("decoding DiscoveryResponse: %w", err)
	}
	applyErr := o.sub.Apply(resp.Resources)
	req := &discovery.DiscoveryRequest{TypeUrl: o.sub.TypeURL, ResponseNonce: resp.Nonce, VersionInfo: o.version}
	if applyErr != nil {
		req.ErrorDetail = errorDetail(applyErr)
	} else {
		req.VersionInfo = resp.VersionInfo
	}
	return ownAnswer{ack: req, applyErr: applyErr, version: resp.VersionInfo}, nil
}

// deltaApplyOwn applies a DeltaDiscoveryResponse (changes and removals) to
// the resources o holds, and gives o every resource of the type, by name.
func deltaApplyOwn(o *ownSub, data []byte) (ownAnswer, error) {
	var resp discovery.DeltaDiscoveryResponse
	if err := proto.Unmarshal(data, &resp); err != nil {
		return ownAnswer{}, fmt.Errorf("decoding DeltaDiscoveryResponse: %w", err)
	}
	next := maps.Clone(o.res)
	if next == nil {
		next = map[string]*discovery.Resource{}
	}
	for _, name := range resp.RemovedResources {
		delete(next, name)
	}
	for _, r := range resp.Resources {
		next[r.GetName()] = r
	}
	var all []*anypb.Any
	for _, name := range slices.Sorted(maps.Keys(next)) {
		if a := next[name].GetResource(); a != nil {
			all = append(all, a)
		}
	}
	applyErr := o.sub.Apply(all)
	req := &discovery.DeltaDiscoveryRequest{TypeUrl: o.sub.TypeURL, ResponseNonce: resp.Nonce}
	if applyErr != nil {
		req.ErrorDetail = errorDetail(applyErr)
	}
	return ownAnswer{ack: req, applyErr: applyErr, version: resp.SystemVersionInfo, res: next}, nil
}

// errorDetail is a NACK's reason.
func errorDetail(err error) *rpcstatus.Status {
	return &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
}

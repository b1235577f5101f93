package xdsproxy

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/testwait"
)

const proxyConfigType = "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"

// applied records what the proxy's own subscription was handed.
type applied struct {
	mu   sync.Mutex
	pems [][]string
}

// apply takes ProxyConfigs and refuses one that holds "bad".
func (a *applied) apply(res []*anypb.Any) error {
	var pems []string
	for _, r := range res {
		pc := &meshconfig.ProxyConfig{}
		if err := r.UnmarshalTo(pc); err != nil {
			return err
		}
		pems = append(pems, pc.GetCaCertificatesPem()...)
	}
	if slices.Contains(pems, "bad") {
		return errors.New("a bad root")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pems = append(a.pems, pems)
	return nil
}

func (a *applied) last() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.pems) == 0 {
		return nil
	}
	return a.pems[len(a.pems)-1]
}

// ownRequests are the ProxyConfig requests the control plane received, in
// order, across streams.
func (r *rig) ownRequests() []*discovery.DiscoveryRequest {
	var out []*discovery.DiscoveryRequest
	for _, c := range r.up.Calls() {
		for _, req := range c.Requests {
			if req.TypeUrl == proxyConfigType {
				out = append(out, req)
			}
		}
	}
	return out
}

func setProxyConfig(t *testing.T, r *rig, pems ...string) {
	t.Helper()
	if err := r.up.SetOpaque(proxyConfigType, map[string]proto.Message{"mesh": &meshconfig.ProxyConfig{CaCertificatesPem: pems}}); err != nil {
		t.Fatal(err)
	}
}

// The proxy asks for ProxyConfig on its own after the client's first
// request, applies and ACKs good answers, NACKs a bad one, asks again with
// the last accepted version on a new upstream stream, and never forwards
// any of it to the client.
func TestOwnSubscriptionProxyConfig(t *testing.T) {
	var got applied
	r := newRig(t, rigOptions{
		opaqueTypes: []string{proxyConfigType},
		tweak: func(c *Config) {
			c.Subscriptions = []Subscription{{TypeURL: proxyConfigType, Apply: got.apply}}
		},
	})
	setClusters(t, r.up, "c1", "a")
	setProxyConfig(t, r, "root-A")

	client := newSotwClient(t, dialSocket(t, r.socket))
	client.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	client.untilVersion(resource.ClusterType, "c1", 10*time.Second)
	testwait.For(t, "ProxyConfig applied", func() bool { return slices.Equal(got.last(), []string{"root-A"}) })
	testwait.For(t, "ProxyConfig ACKed", func() bool {
		reqs := r.ownRequests()
		return len(reqs) >= 2 && reqs[1].ResponseNonce != "" && reqs[1].ErrorDetail == nil && reqs[1].VersionInfo != ""
	})
	reqs := r.ownRequests()
	if reqs[0].VersionInfo != "" || reqs[0].ResponseNonce != "" || len(reqs[0].ResourceNames) != 0 {
		t.Errorf("first ProxyConfig request %v, want a wildcard one with no version", reqs[0])
	}
	goodVersion := reqs[1].VersionInfo

	// A bad answer is NACKed with the last good version; nothing applied.
	setProxyConfig(t, r, "bad")
	testwait.For(t, "ProxyConfig NACKed", func() bool {
		reqs := r.ownRequests()
		last := reqs[len(reqs)-1]
		return len(reqs) >= 3 && last.ErrorDetail != nil
	})
	reqs = r.ownRequests()
	if last := reqs[len(reqs)-1]; last.VersionInfo != goodVersion || last.ResponseNonce == "" {
		t.Errorf("NACK %v, want version %q and the response's nonce", last, goodVersion)
	}
	if !slices.Equal(got.last(), []string{"root-A"}) {
		t.Errorf("applied %v after a bad answer, want the last good root-A", got.last())
	}
	if v := testutil.ToFloat64(r.proxy.metrics.ownResponses.WithLabelValues(proxyConfigType, "nack")); v != 1 {
		t.Errorf("NACK counter %v, want 1", v)
	}

	// A new upstream stream asks again, with the last accepted version.
	before := len(r.ownRequests())
	r.up.Restart(t)
	testwait.For(t, "ProxyConfig asked again", func() bool { return len(r.ownRequests()) > before })
	if again := r.ownRequests()[before]; again.VersionInfo != goodVersion || again.ResponseNonce != "" {
		t.Errorf("request on the new stream %v, want version %q and no nonce", again, goodVersion)
	}
	setProxyConfig(t, r, "root-A", "root-B")
	testwait.For(t, "rotated ProxyConfig applied", func() bool { return slices.Equal(got.last(), []string{"root-A", "root-B"}) })

	// The client saw clusters only.
	setClusters(t, r.up, "c2", "a", "b")
	client.untilVersion(resource.ClusterType, "c2", 10*time.Second)
	for _, c := range r.up.Calls() {
		for _, req := range c.Requests {
			if req.TypeUrl == proxyConfigType && req.Node != nil {
				t.Errorf("the proxy's own request carried a node: %v", req)
			}
		}
	}
}

// The client's stream carries none of the proxy's own responses.
func TestOwnResponsesNotForwarded(t *testing.T) {
	var got applied
	r := newRig(t, rigOptions{
		opaqueTypes: []string{proxyConfigType},
		tweak: func(c *Config) {
			c.Subscriptions = []Subscription{{TypeURL: proxyConfigType, Apply: got.apply}}
		},
	})
	setProxyConfig(t, r, "root-A")
	client := newSotwClient(t, dialSocket(t, r.socket))
	client.send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType})
	testwait.For(t, "ProxyConfig applied", func() bool { return got.last() != nil })
	setClusters(t, r.up, "c1", "a")
	if resp := client.next(10 * time.Second); resp.TypeUrl != resource.ClusterType {
		t.Fatalf("client got %s, want only clusters", resp.TypeUrl)
	}
}

func TestSubscriptionsChecked(t *testing.T) {
	apply := func([]*anypb.Any) error { return nil }
	for _, subs := range [][]Subscription{
		{{TypeURL: proxyConfigType}},
		{{Apply: apply}},
		{{TypeURL: proxyConfigType, Apply: apply}, {TypeURL: proxyConfigType, Apply: apply}},
	} {
		if _, err := New(Config{Upstream: controlplane.Config{Addr: "127.0.0.1:1"}, Subscriptions: subs}); err == nil {
			t.Errorf("New accepted subscriptions %v", subs)
		}
	}
}

// ownDeltaRequests are the delta ProxyConfig requests the control plane
// received, in order, across streams.
func (r *rig) ownDeltaRequests() []*discovery.DeltaDiscoveryRequest {
	var out []*discovery.DeltaDiscoveryRequest
	for _, c := range r.up.Calls() {
		for _, req := range c.DeltaRequests {
			if req.TypeUrl == proxyConfigType {
				out = append(out, req)
			}
		}
	}
	return out
}

// The same on a delta stream: ACKed by nonce, a bad answer NACKed, the
// accepted resource versions sent again on a new upstream stream.
func TestOwnSubscriptionProxyConfigDelta(t *testing.T) {
	var got applied
	r := newRig(t, rigOptions{
		opaqueTypes: []string{proxyConfigType},
		tweak: func(c *Config) {
			c.Subscriptions = []Subscription{{TypeURL: proxyConfigType, Apply: got.apply}}
		},
	})
	setProxyConfig(t, r, "root-A")
	conn := dialSocket(t, r.socket)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	forwarded := make(chan string, 16)
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			forwarded <- resp.TypeUrl
		}
	}()
	if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "ProxyConfig applied", func() bool { return slices.Equal(got.last(), []string{"root-A"}) })
	testwait.For(t, "ProxyConfig ACKed", func() bool {
		reqs := r.ownDeltaRequests()
		return len(reqs) >= 2 && reqs[1].ResponseNonce != "" && reqs[1].ErrorDetail == nil
	})
	if first := r.ownDeltaRequests()[0]; len(first.InitialResourceVersions) != 0 || first.Node != nil {
		t.Errorf("first delta ProxyConfig request %v, want a bare wildcard one", first)
	}

	setProxyConfig(t, r, "bad")
	testwait.For(t, "ProxyConfig NACKed", func() bool {
		reqs := r.ownDeltaRequests()
		return reqs[len(reqs)-1].ErrorDetail != nil
	})
	if !slices.Equal(got.last(), []string{"root-A"}) {
		t.Errorf("applied %v after a bad answer, want the last good root-A", got.last())
	}

	before := len(r.ownDeltaRequests())
	r.up.Restart(t)
	testwait.For(t, "ProxyConfig asked again", func() bool { return len(r.ownDeltaRequests()) > before })
	if again := r.ownDeltaRequests()[before]; len(again.InitialResourceVersions) != 1 || again.InitialResourceVersions["mesh"] == "" {
		t.Errorf("request on the new stream %v, want the accepted version of mesh", again)
	}
	setProxyConfig(t, r, "root-A", "root-B")
	testwait.For(t, "rotated ProxyConfig applied", func() bool { return slices.Equal(got.last(), []string{"root-A", "root-B"}) })

	setClusters(t, r.up, "c1", "a")
	select {
	case typeURL := <-forwarded:
		if typeURL != resource.ClusterType {
			t.Fatalf("client got %s, want only clusters", typeURL)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no clusters forwarded")
	}
}

package trust

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshconfig "istio.io/api/mesh/v1alpha1"
)

func proxyConfigAny(t *testing.T, m proto.Message) []*anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return []*anypb.Any{a}
}

func truncated(t *testing.T, b []byte) []byte {
	t.Helper()
	if len(b) < 2 {
		t.Fatal("nothing to truncate")
	}
	return b[:len(b)-1]
}

// The PEMs are read from the wire without Istio's types: the same as the
// generated code reads, among the other fields of a real ProxyConfig.
func TestProxyConfigPEMsMatchTheGeneratedDecoder(t *testing.T) {
	full := &meshconfig.ProxyConfig{
		ConfigPath:        "./etc/istio/proxy",
		DiscoveryAddress:  "istiod.istio-system.svc:15012",
		CaCertificatesPem: []string{"one", "two"},
		ProxyMetadata:     map[string]string{"ISTIO_META_DNS_CAPTURE": "true"},
		Concurrency:       wrapperspb.Int32(2),
		StatusPort:        15020,
	}
	any := proxyConfigAny(t, full)[0]
	got, err := proxyConfigPEMs(any)
	if err != nil {
		t.Fatal(err)
	}
	back := &meshconfig.ProxyConfig{}
	if err := any.UnmarshalTo(back); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, back.GetCaCertificatesPem()) || !slices.Equal(got, []string{"one", "two"}) {
		t.Fatalf("got %q, the generated decoder %q", got, back.GetCaCertificatesPem())
	}

	// Invalid UTF-8 in the string field is refused, as the generated decoder
	// refuses it.
	bad := &anypb.Any{TypeUrl: ProxyConfigTypeURL, Value: []byte{0x92, 0x02, 0x01, 0xff}}
	if _, err := proxyConfigPEMs(bad); err == nil {
		t.Error("invalid UTF-8 accepted")
	}
	if err := bad.UnmarshalTo(&meshconfig.ProxyConfig{}); err == nil {
		t.Error("the generated decoder accepts the invalid UTF-8 case: the case tests nothing")
	}
}

func TestProxyConfigSource(t *testing.T) {
	pub := newPublisher()
	m, err := NewMerger(MergerConfig{Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Update("file", newRoot(t, "file")); err != nil {
		t.Fatal(err)
	}
	src := NewProxyConfigSource(m)
	a, b := newRoot(t, "a"), newRoot(t, "b")
	pc := func(pems ...[]byte) []*anypb.Any {
		c := &meshconfig.ProxyConfig{}
		for _, p := range pems {
			c.CaCertificatesPem = append(c.CaCertificatesPem, string(p))
		}
		return proxyConfigAny(t, c)
	}
	want := func(names ...string) {
		t.Helper()
		if got := subjects(t, pub.last()); !slices.Equal(got, names) {
			t.Fatalf("bundle %v, want %v", got, names)
		}
	}

	if err := src.Apply(pc(a, b)); err != nil {
		t.Fatal(err)
	}
	want("file", "a", "b")

	// Bad answers are refused alone: the last good roots stay.
	for name, bad := range map[string][]*anypb.Any{
		"not PEM":         pc([]byte("not a certificate")),
		"one bad of two":  pc(a, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")),
		"not ProxyConfig": proxyConfigAny(t, wrapperspb.String("x")),
		"truncated":       {{TypeUrl: ProxyConfigTypeURL, Value: truncated(t, pc(a)[0].Value)}},
		"invalid UTF-8":   {{TypeUrl: ProxyConfigTypeURL, Value: []byte{0x92, 0x02, 0x01, 0xff}}},
	} {
		if err := src.Apply(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	want("file", "a", "b")

	// An answer with no ProxyConfig changes nothing.
	if err := src.Apply(nil); err != nil {
		t.Fatal(err)
	}
	want("file", "a", "b")

	// A rotation: b stays, a goes, c comes.
	c := newRoot(t, "c")
	if err := src.Apply(pc(b, c)); err != nil {
		t.Fatal(err)
	}
	want("file", "b", "c")

	// No extra roots any more: the source's roots leave.
	if err := src.Apply(pc()); err != nil {
		t.Fatal(err)
	}
	want("file")
}

package main

import (
	"hash/fnv"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestSDSRequestWireFormMatchesProto(t *testing.T) {
	for _, tc := range []struct{ version, nonce string }{{"", ""}, {"2026-11-23T10:00:00Z/3", "17"}} {
		var got discovery.DiscoveryRequest
		if err := proto.Unmarshal(appendSDSRequest(nil, defaultSecret, tc.version, tc.nonce), &got); err != nil {
			t.Fatal(err)
		}
		want := &discovery.DiscoveryRequest{VersionInfo: tc.version, Node: benchNode, ResourceNames: []string{defaultSecret},
			TypeUrl: resource.SecretType, ResponseNonce: tc.nonce}
		if !proto.Equal(&got, want) {
			t.Errorf("got %v, want %v", &got, want)
		}
	}
}

func TestScanSDSResponseReadsVersionNonceAndChain(t *testing.T) {
	s := &tlsv3.Secret{Name: defaultSecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: []byte("chain")}},
	}}}
	root, _ := anypb.New(&tlsv3.Secret{Name: "ROOTCA"})
	a, _ := anypb.New(s)
	resp := &discovery.DiscoveryResponse{VersionInfo: "v1", Nonce: "n1", TypeUrl: resource.SecretType, Resources: []*anypb.Any{root, a}}
	b, _ := proto.Marshal(resp)
	r, err := scanSDSResponse(b, defaultSecret)
	if err != nil {
		t.Fatal(err)
	}
	if r.version != "v1" || r.nonce != "n1" || r.key == 0 {
		t.Errorf("got %+v", r)
	}
}

// FuzzScanSDSResponse checks the wire scanner against protobuf's decoder: on
// any input it does not panic, and whatever it accepts decodes to a response
// holding the secret with the same chain, version and nonce.
func FuzzScanSDSResponse(f *testing.F) {
	s, _ := anypb.New(&tlsv3.Secret{Name: defaultSecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: []byte("chain")}},
	}}})
	seed, _ := proto.Marshal(&discovery.DiscoveryResponse{VersionInfo: "v", Nonce: "n", TypeUrl: resource.SecretType, Resources: []*anypb.Any{s}})
	f.Add(seed)
	f.Add([]byte{0x12, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := scanSDSResponse(b, defaultSecret)
		if err != nil {
			return
		}
		var resp discovery.DiscoveryResponse
		if proto.Unmarshal(b, &resp) != nil {
			return // the scanner reads fewer fields than protobuf checks
		}
		if resp.GetVersionInfo() != r.version || resp.GetNonce() != r.nonce {
			t.Fatalf("scanner read %q/%q, protobuf %q/%q", r.version, r.nonce, resp.GetVersionInfo(), resp.GetNonce())
		}
		for _, a := range resp.GetResources() {
			var sec tlsv3.Secret
			if a.UnmarshalTo(&sec) != nil || sec.GetName() != defaultSecret {
				continue
			}
			h := fnv.New64a()
			h.Write(sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
			if h.Sum64() != r.key {
				t.Fatalf("scanner key %x, through protobuf %x", r.key, h.Sum64())
			}
			return
		}
		t.Fatalf("scanner found secret %q, protobuf did not", defaultSecret)
	})
}

package pki_test

import (
	"testing"

	"github.com/meshagent/meshagent/internal/pki"
)

func TestIdentity(t *testing.T) {
	t.Parallel()
	if testID.SPIFFEID != "spiffe://cluster.local/ns/shop/sa/web" || testID.String() != testID.SPIFFEID || testID.IsZero() {
		t.Errorf("SPIFFE identity %+v", testID)
	}
	if !(pki.Identity{}).IsZero() {
		t.Error("zero identity not zero")
	}
	u, err := testID.URI()
	if err != nil || u.Host != "cluster.local" || u.Path != "/ns/shop/sa/web" {
		t.Errorf("URI %v %v", u, err)
	}
	tests := []struct {
		id pki.Identity
		ok bool
	}{
		{testID, true},
		{pki.Identity{SPIFFEID: "spiffe://example.org"}, true},
		{pki.Identity{DNSName: "web.shop.serviceaccount.identity.linkerd.cluster.local"}, true},
		{pki.Identity{}, false},
		{pki.Identity{SPIFFEID: "spiffe://a/b", DNSName: "a"}, false},
		{pki.Identity{SPIFFEID: "https://cluster.local/ns/a"}, false},
		{pki.Identity{SPIFFEID: "spiffe:///ns/a"}, false},
		{pki.Identity{SPIFFEID: "spiffe://user@td/a"}, false},
		{pki.Identity{SPIFFEID: "spiffe://td:8080/a"}, false},
		{pki.Identity{SPIFFEID: "spiffe://td/a?q=1"}, false},
		{pki.Identity{SPIFFEID: "spiffe://td/a#f"}, false},
		{pki.Identity{SPIFFEID: "%zz"}, false},
		// The SPIFFE standard's rules, beyond URL syntax.
		{pki.Identity{SPIFFEID: "spiffe://Cluster.Local/ns/a/sa/b"}, false},
		{pki.Identity{SPIFFEID: "spiffe://td/ns//sa/b"}, false},
		{pki.Identity{SPIFFEID: "spiffe://td/ns/a/sa/b/"}, false},
		{pki.Identity{SPIFFEID: "spiffe://td/ns/./sa/b"}, false},
		{pki.Identity{SPIFFEID: "spiffe://td/ns/../sa/b"}, false},
		{pki.Identity{SPIFFEID: "spiffe://td/ns/a%20b/sa/c"}, false},
		{pki.Identity{SPIFFEID: "SPIFFE://td/ns/a/sa/b"}, false},
		{pki.Identity{DNSName: "a..b"}, false},
		{pki.Identity{DNSName: ".a"}, false},
		{pki.Identity{DNSName: "a."}, false},
		{pki.Identity{DNSName: "a/b"}, false},
		{pki.Identity{DNSName: "a:1"}, false},
	}
	for _, tt := range tests {
		if err := tt.id.Validate(); (err == nil) != tt.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tt.id, err, tt.ok)
		}
	}
}

func TestParseIdentity(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want pki.Identity
		ok   bool
	}{
		{"spiffe://cluster.local/ns/a/sb/b", pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/a/sb/b"}, true},
		{"web.shop.serviceaccount.identity.linkerd.cluster.local", pki.Identity{DNSName: "web.shop.serviceaccount.identity.linkerd.cluster.local"}, true},
		{"spiffe://Cluster.local/x", pki.Identity{}, false},
		{"spiffe://cluster.local/x/../y", pki.Identity{}, false},
		{"", pki.Identity{}, false},
		{"a b", pki.Identity{}, false},
	} {
		got, err := pki.ParseIdentity(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseIdentity(%q) = %v, %v", tt.in, got, err)
		}
		if tt.ok && got.String() != tt.in {
			t.Errorf("ParseIdentity(%q).String() = %q", tt.in, got.String())
		}
	}
}

func TestIdentityMatches(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b pki.Identity
		want bool
	}{
		{testID, testID, true},
		{testID, pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/shop/sa/api"}, false},
		{testID, pki.Identity{SPIFFEID: "spiffe://other.local/ns/shop/sa/web"}, false},
		{pki.Identity{SPIFFEID: "spiffe://td/ns/a/sa/b/"}, pki.Identity{SPIFFEID: "spiffe://td/ns/a/sa/b/"}, false}, // not a SPIFFE ID
		{pki.Identity{DNSName: "a.b"}, pki.Identity{DNSName: "a.b"}, true},
		{pki.Identity{DNSName: "a.b"}, pki.Identity{SPIFFEID: "spiffe://a.b"}, false},
		{pki.Identity{}, pki.Identity{}, false},
	}
	for _, tt := range tests {
		if got := tt.a.Matches(tt.b); got != tt.want {
			t.Errorf("%v.Matches(%v) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

package settings

import (
	"strings"
	"testing"
)

func TestParseNodeUIDs(t *testing.T) {
	got, err := ParseNodeUIDs(" 0=spiffe://cluster.local/ns/kube-system/sa/probe , 65534=spiffe://example.org/nobody")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].String() != "spiffe://cluster.local/ns/kube-system/sa/probe" || got[65534].String() != "spiffe://example.org/nobody" {
		t.Fatalf("ParseNodeUIDs = %v", got)
	}
	if got, err := ParseNodeUIDs(""); err != nil || len(got) != 0 {
		t.Fatalf("ParseNodeUIDs(\"\") = %v, %v", got, err)
	}
	for _, bad := range []string{"0", "x=spiffe://a/b", "-1=spiffe://a/b", "4294967296=spiffe://a/b", "0=https://a/b", "0=spiffe://a/b,0=spiffe://a/c", "0=spiffe://a/b,"} {
		if _, err := ParseNodeUIDs(bad); err == nil {
			t.Errorf("ParseNodeUIDs(%q) succeeded", bad)
		}
	}
}

func FuzzParseNodeUIDs(f *testing.F) {
	f.Add("0=spiffe://cluster.local/ns/a/sa/b,1000=spiffe://td/x")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseNodeUIDs(s)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("error not one line: %q", err)
			}
			return
		}
		for uid, id := range m {
			if id.IsZero() {
				t.Fatalf("uid %d has a zero identity", uid)
			}
		}
	})
}

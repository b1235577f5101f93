package pki_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
)

func mustScheme(t testing.TB, linkerd bool, td, ns string) pki.Scheme {
	t.Helper()
	var (
		s   pki.Scheme
		err error
	)
	if linkerd {
		s, err = pki.LinkerdScheme(td, ns)
	} else {
		s, err = pki.IstioScheme(td)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSchemeRules(t *testing.T) {
	t.Parallel()
	istio := mustScheme(t, false, "cluster.local", "")
	linkerd := mustScheme(t, true, "cluster.local", "")
	tests := []struct {
		name       string
		s          pki.Scheme
		id         string
		audience   string
		serverName string
		renewal    pki.Renewal
	}{
		{"istio", istio, "spiffe://cluster.local/ns/shop/sa/web", "istio-ca", "", pki.Renewal{GraceRatio: 0.5}},
		{"linkerd", linkerd, "web.shop.serviceaccount.identity.linkerd.cluster.local", "identity.l5d.io",
			"linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local",
			pki.Renewal{GraceRatio: 0.3, MinDelay: 10 * time.Second, MaxDelay: 24 * time.Hour}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := tt.s.Identity("shop", "web")
			if err != nil || id.String() != tt.id {
				t.Fatalf("Identity(shop, web) = %v, %v; want %s", id, err, tt.id)
			}
			if err := id.Validate(); err != nil {
				t.Fatal(err)
			}
			if ns, sa, ok := tt.s.Account(id); !ok || ns != "shop" || sa != "web" {
				t.Errorf("Account(%s) = %q %q %v", id, ns, sa, ok)
			}
			if got := tt.s.TokenAudience(); got != tt.audience {
				t.Errorf("TokenAudience = %q, want %q", got, tt.audience)
			}
			if got := tt.s.CAServerName(); got != tt.serverName {
				t.Errorf("CAServerName = %q, want %q", got, tt.serverName)
			}
			if got := tt.s.Renewal(); got != tt.renewal {
				t.Errorf("Renewal = %+v, want %+v", got, tt.renewal)
			}
		})
	}
	if got := mustScheme(t, true, "example.org", "l5d").CAServerName(); got != "linkerd-identity.l5d.serviceaccount.identity.l5d.example.org" {
		t.Errorf("CAServerName with another namespace and trust domain: %q", got)
	}
}

func TestSchemeRefusesBadNames(t *testing.T) {
	t.Parallel()
	if _, err := pki.IstioScheme("Cluster.Local"); err == nil {
		t.Error("IstioScheme accepted an upper-case trust domain")
	}
	if _, err := pki.LinkerdScheme("cluster.local", "a.b"); err == nil {
		t.Error("LinkerdScheme accepted a namespace with a dot")
	}
	if _, err := (pki.Scheme{}).Identity("a", "b"); err == nil {
		t.Error("the zero scheme named an identity")
	}
	bad := map[bool][][2]string{
		false: {{"", "web"}, {"shop", ""}, {"a/b", "web"}, {"shop", "w/b"}, {"shop", "w b"}, {"..", "web"}},
		true:  {{"", "web"}, {"shop", ""}, {"a/b", "web"}, {"shop", "w/b"}, {"a.b", "web"}, {"Shop", "web"}, {"-a", "web"}},
	}
	for linkerd, names := range bad {
		s := mustScheme(t, linkerd, "cluster.local", "")
		for _, n := range names {
			if id, err := s.Identity(n[0], n[1]); err == nil {
				t.Errorf("%s: Identity(%q, %q) = %s, want an error", s, n[0], n[1], id)
			}
		}
	}
}

func TestSchemeAccount(t *testing.T) {
	t.Parallel()
	linkerd := mustScheme(t, true, "cluster.local", "linkerd")
	istio := mustScheme(t, false, "cluster.local", "")
	for _, tt := range []struct {
		s      pki.Scheme
		id     pki.Identity
		ns, sa string
		wantOK bool
	}{
		{linkerd, pki.LinkerdIdentity("cluster.local", "shop", "web", "linkerd"), "shop", "web", true},
		{linkerd, pki.LinkerdIdentity("cluster.local", "shop", "web.v2", "linkerd"), "shop", "web.v2", true},
		{linkerd, pki.LinkerdIdentity("example.org", "shop", "web", "linkerd"), "", "", false},
		{linkerd, pki.LinkerdIdentity("cluster.local", "shop", "web", "l5d"), "", "", false},
		{linkerd, pki.Identity{DNSName: "shop.serviceaccount.identity.linkerd.cluster.local"}, "", "", false},
		{linkerd, pki.Identity{DNSName: ".shop.serviceaccount.identity.linkerd.cluster.local"}, "", "", false},
		{linkerd, pki.Identity{DNSName: "web..serviceaccount.identity.linkerd.cluster.local"}, "", "", false},
		{linkerd, pki.SPIFFEIdentity("cluster.local", "shop", "web"), "", "", false},
		{istio, pki.SPIFFEIdentity("cluster.local", "shop", "web"), "shop", "web", true},
		{istio, pki.SPIFFEIdentity("example.org", "shop", "web"), "", "", false},
		{istio, pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/shop"}, "", "", false},
		{istio, pki.Identity{SPIFFEID: "spiffe://cluster.local/ns/shop/sa/web/x"}, "", "", false},
		{istio, pki.Identity{SPIFFEID: "spiffe://cluster.local/nss/shop/sa/web"}, "", "", false},
		{istio, pki.LinkerdIdentity("cluster.local", "shop", "web", "linkerd"), "", "", false},
	} {
		ns, sa, ok := tt.s.Account(tt.id)
		if ns != tt.ns || sa != tt.sa || ok != tt.wantOK {
			t.Errorf("%s: Account(%s) = %q %q %v, want %q %q %v", tt.s, tt.id, ns, sa, ok, tt.ns, tt.sa, tt.wantOK)
		}
	}
}

func FuzzSchemeAccount(f *testing.F) {
	f.Add("web", "shop", true)
	f.Add("a.b.c", "ns", true)
	f.Add("sa", "ns", false)
	f.Fuzz(func(t *testing.T, sa, ns string, linkerd bool) {
		s := mustScheme(t, linkerd, "cluster.local", "linkerd")
		id, err := s.Identity(ns, sa)
		if err != nil {
			return
		}
		gotNS, gotSA, ok := s.Account(id)
		if !ok || gotNS != ns || gotSA != sa {
			t.Fatalf("round trip of %q/%q: %q %q %v", ns, sa, gotNS, gotSA, ok)
		}
		if strings.Contains(ns, ".") {
			t.Fatalf("namespace %q with a dot was accepted", ns)
		}
	})
}

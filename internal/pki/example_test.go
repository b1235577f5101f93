package pki_test

import (
	"fmt"

	"github.com/meshagent/meshagent/internal/pki"
)

func ExampleScheme() {
	for _, s := range []func() (pki.Scheme, error){
		func() (pki.Scheme, error) { return pki.IstioScheme("cluster.local") },
		func() (pki.Scheme, error) { return pki.LinkerdScheme("cluster.local", "linkerd") },
	} {
		scheme, err := s()
		if err != nil {
			panic(err)
		}
		id, err := scheme.Identity("shop", "web")
		if err != nil {
			panic(err)
		}
		r := scheme.Renewal()
		fmt.Printf("%s\n  %s\n  audience %s, renew with %.1f of the life left, server name %q\n",
			scheme, id, scheme.TokenAudience(), r.GraceRatio, scheme.CAServerName())
	}
	// Output:
	// istio (cluster.local)
	//   spiffe://cluster.local/ns/shop/sa/web
	//   audience istio-ca, renew with 0.5 of the life left, server name ""
	// linkerd (cluster.local, linkerd)
	//   web.shop.serviceaccount.identity.linkerd.cluster.local
	//   audience identity.l5d.io, renew with 0.3 of the life left, server name "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"
}
